"""`datasets` directories as inputs (save_to_disk's, a DatasetDict's splits, the download
cache's), read in place from their Arrow IPC stream files, written here by pyarrow in the
layout `datasets` writes (tests/hf_layouts.py; the real library: test_datasets_reference)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hf_layouts import write_arrow_stream, write_dataset_cache, write_saved_dataset

from astrai_batch.errors import InputError
from astrai_batch.io import open_input
from astrai_batch.io.arrow_input import read_layout

ROWS = 23


def table(rows: int = ROWS, tag: str = "p") -> pa.Table:
    return pa.table(
        {
            "id": [f"{tag}{i}" for i in range(rows)],
            "prompt": [f"{tag} prompt {i}" for i in range(rows)],
            "n": list(range(rows)),
        }
    )


def read(source) -> list[tuple[int, str | None, str | None, dict]]:
    return [(row.index, row.id, row.prompt, dict(row.kept)) for row in source.iter_rows()]


@pytest.mark.parametrize(("shards", "batch_rows"), [(1, 1000), (3, 4), (5, 1)])
def test_a_saved_dataset_reads_in_order_and_by_any_range(
    tmp_path: Path, shards: int, batch_rows: int
) -> None:
    saved = write_saved_dataset(tmp_path / "saved", table(), shards, batch_rows)
    source = open_input(saved, keep_columns=["n"])
    assert (source.format, source.count_rows()) == ("arrow", ROWS)
    assert len(source.files) == shards
    rows = read(source)
    assert rows == [(i, f"p{i}", f"p prompt {i}", {"n": i}) for i in range(ROWS)]
    assert source.kept_schema() == pa.schema([("n", pa.int64())])
    for start in range(ROWS + 1):
        for stop in (start, start + 1, start + 7, None):
            got = [(row.index, row.id) for row in source.iter_rows(start, stop)]
            end = ROWS if stop is None else min(stop, ROWS)
            assert got == [(i, f"p{i}") for i in range(start, end)], (start, stop)


def test_an_arrow_file_in_the_ipc_file_format_reads_too(tmp_path: Path) -> None:
    path = tmp_path / "x.arrow"
    data = table(10)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, data.schema) as writer:
        for batch in data.to_batches(max_chunksize=3):
            writer.write_batch(batch)
    source = open_input(path)
    assert read_layout(source.files[0])[1] == (3, 3, 3, 1)
    assert [row.id for row in source.iter_rows(4, 8)] == ["p4", "p5", "p6", "p7"]


def test_a_dataset_dict_names_its_splits(tmp_path: Path) -> None:
    root = tmp_path / "dd"
    write_saved_dataset(root / "train", table(), 1, 1000)
    write_saved_dataset(root / "test", table(4, "t"), 1, 1000)
    (root / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(InputError) as refused:
        open_input(root)
    assert str(refused.value) == (
        f"{root} is a saved DatasetDict with the splits train, test: name one split's "
        f"directory, e.g. {root}/train"
    )
    assert [row.id for row in open_input(root / "test").iter_rows()] == ["t0", "t1", "t2", "t3"]


def test_a_cache_directory_with_one_split_is_the_input(tmp_path: Path) -> None:
    cache = write_dataset_cache(tmp_path / "c", "my_set", {"train": table()}, 2, batch_rows=5)
    source = open_input(cache)
    assert [file.name for file in source.files] == [
        "my_set-train-00000-of-00002.arrow",
        "my_set-train-00001-of-00002.arrow",
    ]
    assert [row.id for row in source.iter_rows()] == [f"p{i}" for i in range(ROWS)]


def test_a_cache_directory_with_several_splits_names_one_file_or_glob_each(
    tmp_path: Path,
) -> None:
    splits = {"train": table(), "validation": table(3, "v")}
    sharded = write_dataset_cache(tmp_path / "s", "set", splits, shards=2)
    with pytest.raises(InputError) as refused:
        open_input(sharded)
    assert str(refused.value) == (
        f"{sharded} holds the splits train, validation of a `datasets` cache: name one "
        f"split's files, e.g. {sharded}/set-train-*.arrow or {sharded}/set-validation-*.arrow"
    )
    got = open_input(f"{sharded}/set-validation-*.arrow")
    assert [row.id for row in got.iter_rows()] == ["v0", "v1", "v2"]
    single = write_dataset_cache(tmp_path / "one", "set", splits)
    named = r"e\.g\. .*/set-train\.arrow or .*/set-validation\.arrow$"
    with pytest.raises(InputError, match=named):
        open_input(single)
    assert open_input(single / "set-train.arrow").count_rows() == ROWS


def test_broken_datasets_directories_are_errors_in_the_users_terms(tmp_path: Path) -> None:
    saved = write_saved_dataset(tmp_path / "saved", table(), 2, 1000)
    (saved / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(InputError) as missing:
        open_input(saved)
    assert str(missing.value) == (
        f"{saved}/state.json names data-00001-of-00002.arrow, which is not in {saved}"
    )
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(b"not arrow at all")
    with pytest.raises(InputError, match=r"^cannot read Arrow file bad\.arrow: "):
        open_input(bad)
    no_prompt = tmp_path / "np.arrow"
    write_arrow_stream(no_prompt, pa.table({"text": ["a"]}), 10)
    with pytest.raises(InputError, match=r"np\.arrow"):
        open_input(no_prompt)
