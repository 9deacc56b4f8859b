"""Checkpoint directories: creating, resuming, refusing another job's, cleaning up."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from astrai_batch.errors import CheckpointError
from astrai_batch.jobs.output.checkpoint import WindowRecord, checkpoint_dir_for
from astrai_batch.jobs.output.checkpoint_manifest import ExecutorMark
from astrai_batch.jobs.output.checkpoint_opening import open_checkpoint
from astrai_batch.jobs.output.identity import job_differences
from astrai_batch.jobs.output.records import error_record, part_schema, records_table
from astrai_batch.jobs.output.run_lock import LOCK_NAME
from astrai_batch.jobs.output.stats import WorkStats
from astrai_batch.jobs.planning.prefix_order import PlanningOptions
from astrai_batch.jobs.planning.window import PreparedRow

SCHEMA = part_schema(pa.schema([]))
JOB = {
    "input": {"format": "jsonl", "files": [{"path": "/data/in.jsonl", "size": 10, "sha256": "a"}]},
    "model": {"name": "tiny", "source": "/models/tiny", "digest": "files:1"},
    "options": {"max_tokens": 4, "stop": ("x",)},
}
PLANNING = PlanningOptions(page_size=16, grouping=True, group_window=100)


def failed_rows(*indices: int) -> pa.Table:
    rows = [
        PreparedRow(i, f"id-{i}", None, "completion", {}, None, None, "bad", None) for i in indices
    ]
    return records_table([error_record(row, "bad") for row in rows], SCHEMA)


def stats(rows: int) -> WorkStats:
    return WorkStats(input_rows=rows, output_rows=rows, failed_rows=rows, wall_seconds=0.5)


def test_directory_is_hidden_beside_the_output(tmp_path: Path) -> None:
    assert checkpoint_dir_for(tmp_path / "out.parquet") == tmp_path / ".out.parquet.ckpt"


def test_parts_are_saved_and_found_again(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    checkpoint = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    assert checkpoint.is_empty and (directory / "manifest.json").is_file()
    checkpoint.record_window(WindowRecord(0, 0, 3, 0, 2))
    checkpoint.write_part(0, failed_rows(2, 0), stats(2))
    checkpoint.write_part(0, failed_rows(1), stats(1))
    checkpoint.record_window(WindowRecord(1, 3, 3, 2, 1))
    checkpoint.write_part(1, failed_rows(4), stats(1))
    checkpoint.check_invariants()

    again = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    again.check_invariants()
    assert again.run_id == checkpoint.run_id
    assert [p.name for p in again.part_paths()] == [
        "part-000001.parquet",
        "part-000002.parquet",
        "part-000003.parquet",
    ]
    assert again.done_indices(0) == {0, 1, 2} and again.done_indices(1) == {4}
    assert again.is_window_complete(0) and not again.is_window_complete(1)
    assert again.first_incomplete_window() == 1
    assert (again.group_offset(1), again.group_offset(2)) == (2, 3)
    assert again.window_stats(0) == WorkStats(
        input_rows=3, output_rows=3, failed_rows=3, wall_seconds=1.0
    )
    assert again.total_stats().input_rows == 4
    assert list(again.stats_by_window()) == [0, 1]


def test_another_jobs_checkpoint_is_refused_with_what_changed(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    saved = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    saved.record_window(WindowRecord(0, 0, 3, 0, 1))
    saved.write_part(0, failed_rows(0), stats(1))
    changed = {
        **JOB,
        "model": {"name": "other", "source": "/models/other", "digest": "files:2"},
        "options": {"max_tokens": 8, "stop": ["x"], "seed": 3},
    }
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(directory, changed, planning=PLANNING, restart=False)
    assert str(caught.value) == (
        f"the checkpoint in {directory} was made by a different job (model 'tiny' "
        "(/models/tiny) -> 'other' (/models/other); max_tokens 4 -> 8; seed unset -> 3); "
        "rerun with --restart to discard it and start over, or restore the original settings "
        "to resume"
    )
    # --restart discards it and starts a new one.
    fresh = open_checkpoint(directory, changed, planning=PLANNING, restart=True)
    assert fresh.is_empty
    assert json.loads((directory / "manifest.json").read_text())["job"]["model"]["name"] == "other"


def test_a_checkpoint_without_finished_rows_never_blocks_another_job(tmp_path: Path) -> None:
    """A run killed while it loaded or before its first save leaves a manifest and nothing
    else; a rerun with other options starts over instead of being refused."""
    directory = tmp_path / ".out.ckpt"
    empty = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    empty.record_window(WindowRecord(0, 0, 3, 0, 1))
    changed = {**JOB, "options": {"max_tokens": 8, "stop": ["x"]}}
    fresh = open_checkpoint(directory, changed, planning=PLANNING, restart=False)
    assert fresh.is_empty and fresh.run_id != empty.run_id
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["job"]["options"]["max_tokens"] == 8 and manifest["windows"] == []


def test_differences_are_named_by_content_not_by_path() -> None:
    def with_input(path: str, sha: str, fmt: str = "jsonl") -> dict:
        return {
            **JOB,
            "input": {"format": fmt, "files": [{"path": path, "size": 10, "sha256": sha}]},
        }

    assert job_differences(JOB, with_input("/data/in.jsonl", "b")) == [
        "input file /data/in.jsonl was modified"
    ]
    assert job_differences(JOB, with_input("/new/in.jsonl", "b")) == [
        "input file /new/in.jsonl differs from /data/in.jsonl, the checkpoint's input"
    ]
    assert job_differences(JOB, with_input("/new/in.jsonl", "a", "parquet")) == [
        "input format jsonl -> parquet"
    ]
    two = {**JOB, "input": {"format": "jsonl", "files": [JOB["input"]["files"][0]] * 2}}
    assert job_differences(JOB, two) == [
        "input has 2 files, the checkpoint's input had 1 (/data/in.jsonl)"
    ]
    # The same bytes at a new path, the same model files elsewhere: the same job.
    moved_model = {**JOB, "model": {"name": "t2", "source": "/m/t2", "digest": "files:1"}}
    assert job_differences(JOB, {**with_input("/new/in.jsonl", "a"), **moved_model}) == []
    changed_model = {**JOB, "model": {**JOB["model"], "digest": "files:3"}}
    assert job_differences(JOB, changed_model) == [
        "model 'tiny' (/models/tiny) has different files"
    ]
    assert job_differences(JOB, json.loads(json.dumps(JOB))) == []


def test_planning_is_kept_from_the_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    other = PlanningOptions(page_size=32, grouping=False, group_window=7)
    assert open_checkpoint(directory, JOB, planning=other, restart=False).planning == PLANNING
    assert open_checkpoint(directory, JOB, planning=other, restart=True).planning == other


def test_the_run_lock_file_survives_cleaning_and_restart(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    directory.mkdir()
    (directory / LOCK_NAME).write_text("123\n")
    open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    assert sorted(p.name for p in directory.iterdir()) == [LOCK_NAME, "manifest.json"]
    open_checkpoint(directory, JOB, planning=PLANNING, restart=True)
    assert (directory / LOCK_NAME).read_text() == "123\n"


def test_first_error_is_the_earliest_failed_row(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(tmp_path / ".ckpt", JOB, planning=PLANNING, restart=False)
    assert checkpoint.first_error() is None
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 1))
    checkpoint.write_part(0, failed_rows(4, 2), stats(2))
    checkpoint.write_part(0, failed_rows(3), stats(1))
    assert checkpoint.first_error() == (2, "bad")


def test_unlisted_and_temporary_files_are_removed_on_open(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    checkpoint = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 1))
    checkpoint.write_part(0, failed_rows(0), stats(1))
    # What a kill leaves: a part written but not yet listed, and a half-written temp file.
    (directory / "part-000002.parquet").write_bytes(b"unlisted")
    (directory / ".part-000003.parquet.tmp-123-abcd").write_bytes(b"torn")
    (directory / ".manifest.json.tmp-123-abcd").write_bytes(b"{")

    again = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)

    assert sorted(p.name for p in directory.iterdir()) == ["manifest.json", "part-000001.parquet"]
    again.write_part(0, failed_rows(1), stats(1))
    assert again.done_indices(0) == {0, 1}


@pytest.mark.parametrize("refusal", ["another job", "another executor"])
def test_a_refused_checkpoint_keeps_its_debris_too(tmp_path: Path, refusal: str) -> None:
    # A kill -9 mid-write leaves a temp file; a rerun that is refused must not touch it (it
    # did: the debris went before the refusal, so "refused and kept" depended on timing).
    directory = tmp_path / ".out.ckpt"
    checkpoint = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 1))
    checkpoint.write_part(0, failed_rows(0), stats(1))
    (directory / "part-000002.parquet").write_bytes(b"unlisted")
    (directory / ".part-000003.parquet.tmp-4194000-abcd").write_bytes(b"torn")
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    job, executor = JOB, ExecutorMark("local")
    if refusal == "another job":
        job = {**JOB, "options": {"max_tokens": 5, "stop": ["x"]}}
    else:
        executor = ExecutorMark("ray", 2, 1)

    with pytest.raises(CheckpointError):
        open_checkpoint(directory, job, planning=PLANNING, restart=False, executor=executor)

    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_damage_is_reported_with_the_restart_hint(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    checkpoint = open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 1))
    checkpoint.write_part(0, failed_rows(0), stats(1))
    (directory / "part-000001.parquet").unlink()
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(directory, JOB, planning=PLANNING, restart=False)
    assert str(caught.value) == (
        f"checkpoint part {directory / 'part-000001.parquet'} is missing; rerun with "
        "--restart to discard it and start over"
    )

    (directory / "manifest.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="cannot read checkpoint manifest"):
        open_checkpoint(directory, JOB, planning=PLANNING, restart=False)


def test_a_window_must_be_planned_the_same_way_again(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(tmp_path / ".ckpt", JOB, planning=PLANNING, restart=False)
    with pytest.raises(CheckpointError, match="window 0 must be recorded before its parts"):
        checkpoint.write_part(0, failed_rows(0), stats(1))
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 2))
    checkpoint.record_window(WindowRecord(0, 0, 5, 0, 2))
    with pytest.raises(CheckpointError) as caught:
        checkpoint.record_window(WindowRecord(0, 0, 5, 0, 3))
    assert str(caught.value) == (
        "window 0 was planned as {'number': 0, 'start': 0, 'rows': 5, 'group_offset': 0, "
        "'num_groups': 2} before but as {'number': 0, 'start': 0, 'rows': 5, "
        "'group_offset': 0, 'num_groups': 3} now; rerun with --restart to discard it and start "
        "over"
    )


def test_remove_deletes_the_directory(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(tmp_path / ".ckpt", JOB, planning=PLANNING, restart=False)
    checkpoint.remove()
    assert not (tmp_path / ".ckpt").exists()
