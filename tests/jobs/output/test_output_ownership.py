"""Never touch what is not ours: an existing OUTPUT is refused in one line unless it is our
own (or `--overwrite` names one of our outputs), and `--overwrite` replaces atomically: the
old output stays whole and readable until the new one is committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, listing, run_cli, write_jsonl

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import AtomicObject, resolve
from astrai_batch.jobs.output.assembly import write_parquet_stream
from astrai_batch.jobs.output.output_guard import check_existing_output
from astrai_batch.jobs.output.parquet_dir import write_parquet_dir

SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("completion", pa.string())])


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def rows_table(tag: str, count: int) -> pa.Table:
    return pa.table({"id": [f"r{i}" for i in range(count)], "completion": [tag] * count})


def test_a_foreign_dataset_directory_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """The issue's repro: a pyarrow dataset (``part-0.parquet``) at OUTPUT and a model that
    does not exist. Before: the directory was deleted, then the model was not found."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    dataset = tmp_path / "my_dataset"
    ds.write_dataset(rows_table("user", 3), dataset, format="parquet")
    before = snapshot(dataset)
    for extra in ([], ["--overwrite"]):
        result = run_cli(
            "run",
            source,
            dataset,
            "--output-format",
            "parquet-dir",
            "--model",
            "/nonexistent",
            *extra,
        )
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: output {dataset} holds files astrai-batch did not write (part-0.parquet); "
            "move them away or choose another output\n"
        )
        assert snapshot(dataset) == before


def test_a_foreign_stats_file_is_refused_without_overwrite(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    stats = tmp_path / "out.stats.parquet"
    stats.write_bytes(b"the user's own file")
    result = run_cli("run", source, tmp_path / "out.parquet", "--model", "/nonexistent")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: output {stats} already exists; pass --overwrite to replace it\n"
    )
    assert stats.read_bytes() == b"the user's own file"


def test_our_directory_is_refused_without_overwrite_and_replaced_with_it(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"Question {i}"} for i in range(3)])
    output = tmp_path / "out"
    args = [*engine_args(tiny_llama_dir), "--output-format", "parquet-dir"]
    assert run_cli("run", source, output, *args).exit_code == 0
    first = snapshot(output)

    again = run_cli("run", source, output, *args)
    assert again.exit_code == 1
    assert (
        again.stderr == f"Error: output {output} already exists; pass --overwrite to replace it\n"
    )
    assert snapshot(output) == first

    replaced = run_cli("run", source, output, *args, "--overwrite")
    assert replaced.exit_code == 0, replaced.stderr
    assert listing(output) == ["_index.json", "part-00000.parquet"]
    assert json.loads((output / "_index.json").read_text())["rows"] == 3
    assert [n for n in listing(tmp_path) if n.startswith(".out")] == []


def checked_tables(check, tables: list[pa.Table], fail: bool) -> Iterator[pa.Table]:
    """Yields `tables`, calling `check` before each (mid-write); raises at the end if `fail`."""
    for table in tables:
        check()
        yield table
    check()
    if fail:
        raise RuntimeError("killed mid-write")


def write_dir_output(output, tag: str, run_id: str, tables=None, *, overwrite: bool) -> None:
    parts = tables if tables is not None else [rows_table(tag, 2), rows_table(tag, 1)]
    write_parquet_dir(output, parts, SCHEMA, {"astrai_batch.run_id": run_id}, overwrite)


def read_dir(location) -> list[str]:
    """The output as a reader honouring the index reads it."""
    index = json.loads(location.child("_index.json").read_bytes())
    return [
        value
        for entry in index["parts"]
        for value in location.child(entry["file"]).read_parquet().column("completion").to_pylist()
    ]


@pytest.mark.parametrize("fail", [False, True], ids=["committed", "killed"])
def test_overwriting_a_local_directory_keeps_the_old_one_until_the_commit(
    tmp_path: Path, fail: bool
) -> None:
    output = resolve(tmp_path / "out")
    write_dir_output(output, "old", "aaaa", overwrite=False)
    old = snapshot(tmp_path / "out")

    def old_is_intact() -> None:
        assert snapshot(tmp_path / "out") == old
        assert pq.read_table(tmp_path / "out").column("completion").to_pylist() == ["old"] * 3

    tables = checked_tables(old_is_intact, [rows_table("new", 4)], fail)
    if fail:
        with pytest.raises(RuntimeError, match="killed mid-write"):
            write_dir_output(output, "new", "bbbb", tables, overwrite=True)
        old_is_intact()
        # The rerun (same run id) clears what the killed attempt left and commits.
        write_dir_output(output, "new", "bbbb", [rows_table("new", 4)], overwrite=True)
    else:
        write_dir_output(output, "new", "bbbb", tables, overwrite=True)
    assert listing(tmp_path) == ["out"]
    assert listing(tmp_path / "out") == ["_index.json", "part-00000.parquet"]
    assert read_dir(output) == ["new"] * 4


def test_overwrite_keeps_files_the_old_index_does_not_name_by_refusing(tmp_path: Path) -> None:
    output = resolve(tmp_path / "out")
    write_dir_output(output, "old", "aaaa", overwrite=False)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path / "out")
    with pytest.raises(OutputError, match=r"holds files astrai-batch did not write \(notes.txt\)"):
        write_dir_output(output, "new", "bbbb", overwrite=True)
    assert snapshot(tmp_path / "out") == before


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_overwriting_a_file_keeps_the_old_one_until_the_commit(request, tmp_path: Path, storage):
    if storage == "local":
        target = resolve(tmp_path / "out.parquet")
    else:
        target = resolve(request.getfixturevalue("s3_bucket").uri("files/out.parquet"))
    with target.fs.open_output_stream(target.path) as stream:
        stream.write(b"old output")

    def old_is_intact() -> None:
        assert target.read_bytes() == b"old output"

    output = AtomicObject(target, overwrite=True)
    tables = checked_tables(old_is_intact, [rows_table("new", 2)], False)
    write_parquet_stream(output, tables, SCHEMA, {})
    assert target.read_parquet().column("completion").to_pylist() == ["new"] * 2


def test_overwriting_a_directory_on_s3_deletes_only_the_old_index_parts(s3_bucket) -> None:
    output = resolve(s3_bucket.uri("owned/out"))
    write_dir_output(output, "old", "aaaa", overwrite=False)
    old_names = s3_bucket.names("owned/out")
    assert old_names == [
        "bucket/owned/out/_index.json",
        "bucket/owned/out/part-aaaa-00000.parquet",
        "bucket/owned/out/part-aaaa-00001.parquet",
    ]

    def old_is_intact() -> None:
        assert read_dir(output) == ["old"] * 3

    tables = checked_tables(old_is_intact, [rows_table("new", 4)], True)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_dir_output(output, "new", "bbbb", tables, overwrite=True)
    old_is_intact()
    write_dir_output(output, "new", "bbbb", [rows_table("new", 4)], overwrite=True)
    assert s3_bucket.names("owned/out") == [
        "bucket/owned/out/_index.json",
        "bucket/owned/out/part-bbbb-00000.parquet",
    ]
    assert read_dir(output) == ["new"] * 4

    with s3_bucket.fs.open_output_stream("bucket/owned/out/notes.txt") as stream:
        stream.write(b"mine")
    with pytest.raises(OutputError, match=r"did not write \(notes.txt\)"):
        write_dir_output(output, "newer", "cccc", overwrite=True)
    assert read_dir(output) == ["new"] * 4


def test_a_finished_directory_of_this_checkpoint_is_recognised_and_its_staging_cleared(
    tmp_path: Path,
) -> None:
    """Killed after the swap, before the checkpoint was removed: the rerun finds its own
    output (same run id) and the swapped-out old directory beside it, and clears only that."""
    output = resolve(tmp_path / "out")
    write_dir_output(output, "done", "runA", overwrite=False)
    staging = tmp_path / ".out.tmp-runA"
    staging.mkdir()
    (staging / "part-00000.parquet").write_bytes(b"the old output, swapped out")
    (staging / "_index.json").write_text(json.dumps({"parts": [{"file": "part-00000.parquet"}]}))
    stats = resolve(tmp_path / "out.stats.parquet")

    finished = check_existing_output(
        output, stats, output_format="parquet-dir", overwrite=False, run_id="runA"
    )

    assert finished == "runA"
    assert listing(tmp_path) == ["out"]
    with pytest.raises(OutputError, match=r"already exists; pass --overwrite"):
        check_existing_output(
            output, stats, output_format="parquet-dir", overwrite=False, run_id="runB"
        )


def test_a_killed_attempts_own_parts_on_s3_are_not_foreign(s3_bucket) -> None:
    output = resolve(s3_bucket.uri("killed/out"))
    stats = resolve(s3_bucket.uri("killed/out.stats.parquet"))
    with s3_bucket.fs.open_output_stream("bucket/killed/out/part-runA-00000.parquet") as stream:
        stream.write(b"half a commit")
    assert (
        check_existing_output(
            output, stats, output_format="parquet-dir", overwrite=False, run_id="runA"
        )
        is None
    )
    with pytest.raises(OutputError, match=r"did not write \(part-runA-00000.parquet\)"):
        check_existing_output(
            output, stats, output_format="parquet-dir", overwrite=True, run_id="runB"
        )
    write_dir_output(output, "new", "runA", [rows_table("new", 2)], overwrite=False)
    assert s3_bucket.names("killed/out") == [
        "bucket/killed/out/_index.json",
        "bucket/killed/out/part-runA-00000.parquet",
    ]
    assert read_dir(output) == ["new"] * 2


def test_a_rerun_of_the_same_job_rewrites_its_own_s3_directory(s3_bucket) -> None:
    """A Ray driver killed after its index landed, before it removed its checkpoint, writes
    the same directory again: its own index is replaced, not refused."""
    output = resolve(s3_bucket.uri("again/out"))
    write_dir_output(output, "same", "runA", overwrite=False)
    write_dir_output(output, "same", "runA", overwrite=False)
    assert read_dir(output) == ["same"] * 3
    assert len(s3_bucket.names("again/out")) == 3
