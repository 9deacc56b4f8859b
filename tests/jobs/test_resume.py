"""Crashes and interrupts: kill -9 at several points, SIGTERM, changed settings, --restart.

A resumed job must produce the output an uninterrupted run produces. `cached_tokens` is the
one column left out of that comparison: it records how much of the prompt the cache served
when the row ran, and a restarted process starts with a cold cache.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import (
    ROWS,
    comparable,
    job_args,
    listing,
    read_rows,
    run_cli,
    saved_rows,
    stop_after_parts,
    summary_of,
)

from astrai_batch.jobs.output.checkpoint import Checkpoint


def test_kill_9_at_several_points_then_rerun_equals_an_uninterrupted_run(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    for parts in (2, 9, 17):
        returncode, _, _ = stop_after_parts(args, job["checkpoint"], parts, signal.SIGKILL)
        assert returncode == -signal.SIGKILL
        assert not job["output"].exists()
    done_before = saved_rows(job["checkpoint"])
    assert 0 < done_before < ROWS

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert (summary["resumed_rows"], summary["rows_done"]) == (done_before, ROWS)
    assert comparable(job["output"]) == comparable(job["reference"])
    assert listing(job["output"].parent) == ["out.parquet", "out.stats.parquet"]
    rows = read_rows(job["output"])
    totals = read_rows(job["output"].with_name("out.stats.parquet"))[-1]
    assert totals["rows"] == ROWS
    assert totals["cached_tokens"] == sum(row["cached_tokens"] for row in rows)
    assert totals["prompt_tokens"] == sum(row["prompt_tokens"] for row in rows)


def test_sigterm_keeps_finished_rows_then_changed_settings_are_refused(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    returncode, stdout, stderr = stop_after_parts(args, job["checkpoint"], 3, signal.SIGTERM)

    assert returncode == 143
    summary = summary_of(stdout)
    assert (summary["status"], summary["exit_code"], summary["output"]) == (
        "interrupted",
        143,
        None,
    )
    assert stderr.endswith(
        f"astrai-batch: interrupted by SIGTERM; finished rows are saved in {job['checkpoint']}, "
        "rerun the same command to resume\n"
    )
    assert saved_rows(job["checkpoint"]) >= 12
    assert summary["rows_done"] == saved_rows(job["checkpoint"])
    assert not job["output"].exists()

    changed = run_cli(*job_args(tiny_llama_dir, job["source"], job["output"], "--max-tokens", "5"))
    assert changed.exit_code == 1
    assert changed.stderr == (
        f"Error: the checkpoint in {job['checkpoint']} was made by a different job "
        "(max_tokens 4 -> 5); rerun with --restart to discard it and start over, or restore "
        "the original settings to resume\n"
    )
    assert not job["output"].exists()

    resumed = run_cli(*args)
    assert resumed.exit_code == 0, resumed.stderr
    assert summary_of(resumed.stdout)["resumed_rows"] == summary["rows_done"]
    assert comparable(job["output"]) == comparable(job["reference"])


def test_restart_discards_the_checkpoint(tiny_llama_dir: Path, job: dict[str, Path]) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    stop_after_parts(args, job["checkpoint"], 2, signal.SIGKILL)
    assert saved_rows(job["checkpoint"]) > 0

    result = run_cli(*args, "--restart", "--max-tokens", "2")

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == 0
    assert not job["checkpoint"].exists()
    assert max(row["completion_tokens"] for row in read_rows(job["output"])) <= 2


def test_restart_removes_only_this_checkpoints_files_and_says_so(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    stop_after_parts(args, job["checkpoint"], 2, signal.SIGKILL)
    # the kill may land after a part's file is written and before the manifest names it:
    # that file is this checkpoint's too (its parts' name), and the restart removes it
    parts = len(list(job["checkpoint"].glob("part-[0-9][0-9][0-9][0-9][0-9][0-9].parquet")))
    assert parts >= len(json.loads((job["checkpoint"] / "manifest.json").read_text())["parts"])
    rows = saved_rows(job["checkpoint"])
    # Something this checkpoint did not write: a user's note, another run's shard part.
    (job["checkpoint"] / "notes.txt").write_text("mine")
    other = "shard-0-of-2-00000000000000ff.parquet"
    (job["checkpoint"] / other).write_bytes(b"not ours to judge")

    loud = [arg for arg in args if arg != "--quiet"]
    result = run_cli(*loud, "--restart", "--max-tokens", "2")

    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "--restart" in line]
    assert said == [
        f"astrai-batch: --restart: removed the checkpoint in {job['checkpoint']} ({parts} parts "
        f"holding {rows} finished rows); kept notes.txt, {other}, which this checkpoint did "
        "not write"
    ]
    assert summary_of(result.stdout)["resumed_rows"] == 0
    assert sorted(p.name for p in job["checkpoint"].iterdir()) == [".lock", "notes.txt", other]
    assert (job["checkpoint"] / "notes.txt").read_text() == "mine"


def test_a_crash_after_the_output_is_written_is_finished_by_the_rerun(
    tiny_llama_dir: Path, job: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    # The process "dies" right after committing the output: its checkpoint stays behind.
    monkeypatch.setattr(Checkpoint, "remove", lambda self: None)
    assert run_cli(*args).exit_code == 0
    assert job["checkpoint"].exists()
    written = job["output"].stat().st_mtime_ns
    monkeypatch.undo()

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert (summary["status"], summary["resumed_rows"]) == ("completed", ROWS)
    assert not job["checkpoint"].exists()
    assert job["output"].stat().st_mtime_ns == written
    assert pq.read_metadata(job["output"]).num_rows == ROWS


def test_parts_saved_before_a_kill_are_whole_files(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    stop_after_parts(args, job["checkpoint"], 5, signal.SIGKILL)
    manifest = json.loads((job["checkpoint"] / "manifest.json").read_text())
    for part in manifest["parts"]:
        table = pq.read_table(job["checkpoint"] / part["file"])
        assert table.num_rows == part["stats"]["output_rows"]
