"""One run per output: a second run on a live run's output stops at once and touches nothing;
the lock dies with its process, so a rerun after kill -9 resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from jobs.jobkit import (
    ROWS,
    comparable,
    job_args,
    killed_part_way,
    listing,
    run_cli,
    saved_rows,
    start_process,
    summary_of,
    wait_for_parts,
)

from astrai_batch.jobs.output.run_lock import LOCK_NAME, RunLock, RunLockedError


def test_a_second_lock_on_the_directory_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    first = RunLock(directory, "out.parquet")
    first.acquire()
    assert (directory / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(RunLockedError) as caught:
        RunLock(directory, "out.parquet").acquire()
    assert (
        str(caught.value) == f"another astrai-batch run (pid {os.getpid()}) is writing out.parquet"
    )
    first.release()
    # Nothing was saved: the directory goes with the lock.
    assert not directory.exists()
    second = RunLock(directory, "out.parquet")
    second.acquire()
    (directory / "manifest.json").write_text("{}")
    second.release()
    assert sorted(p.name for p in directory.iterdir()) == [LOCK_NAME, "manifest.json"]


def test_the_lock_of_a_dead_process_is_free(tmp_path: Path) -> None:
    directory = tmp_path / ".out.ckpt"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from astrai_batch.jobs.output.run_lock import RunLock;"
            f"RunLock(Path({str(directory)!r}), 'out').acquire(); print('held', flush=True);"
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            RunLock(directory, "out").acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(directory, "out")
    lock.acquire()
    assert (directory / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()


def test_a_second_run_on_a_live_runs_output_exits_1_and_touches_nothing(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    first = start_process(*args)
    try:
        wait_for_parts(first, job["checkpoint"], 2)
        # Paused, the first run is alive and holds its lock while the others try.
        first.send_signal(signal.SIGSTOP)
        rows_saved = saved_rows(job["checkpoint"])
        # A temporary file of a dead writer, which a run that starts would clean up.
        stale = job["output"].parent / ".out.parquet.tmp-999999999-abcd"
        stale.write_bytes(b"torn")
        for extra in ((), ("--restart",), ("--overwrite", "--max-tokens", "2")):
            second = start_process(*args, *extra)
            stdout, stderr = second.communicate(timeout=120)
            assert second.returncode == 1
            assert stdout == ""
            assert stderr == (
                f"Error: another astrai-batch run (pid {first.pid}) is writing {job['output']}\n"
            )
            assert stale.exists()
            assert saved_rows(job["checkpoint"]) == rows_saved
            assert (job["checkpoint"] / LOCK_NAME).read_text() == f"{first.pid}\n"
        stale.unlink()
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)

    assert first.returncode == 0, stderr
    assert summary_of(stdout)["rows_done"] == ROWS
    assert comparable(job["output"]) == comparable(job["reference"])
    assert listing(job["output"].parent) == ["out.parquet", "out.stats.parquet"]


def test_kill_9_of_the_holder_then_a_rerun_resumes(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args, done_before = killed_part_way(tiny_llama_dir, job)
    # The dead holder's pid is still in the lock file, but the kernel dropped its lock.
    assert (job["checkpoint"] / LOCK_NAME).exists()

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == done_before > 0
    assert comparable(job["output"]) == comparable(job["reference"])
    assert listing(job["output"].parent) == ["out.parquet", "out.stats.parquet"]


def test_a_refused_start_leaves_no_checkpoint_directory(tmp_path: Path) -> None:
    output = tmp_path / "out.parquet"
    result = run_cli("run", tmp_path / "missing.jsonl", output, "--quiet")
    assert result.exit_code == 1
    assert listing(tmp_path) == []
