"""Kills at the last boundaries of a job, placed exactly with the crash-point hook: after the
output is committed, and in the middle of removing the checkpoint (found by the soak, seed
539213138: a kill while the checkpoint was being deleted left an output no rerun accepted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from jobs.jobkit import REPO_ROOT, engine_args, shared_prefix_prompts, summary_of, write_jsonl

from astrai_batch.jobs.crash_points import CRASH_ENV


def run(args: list, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.pop(CRASH_ENV, None)
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    command = [sys.executable, "-m", "astrai_batch.cli", *map(str, args)]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)


def test_a_kill_while_the_checkpoint_is_removed_leaves_a_job_the_rerun_completes(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(6))]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output, checkpoint = tmp_path / "out.parquet", tmp_path / ".out.parquet.ckpt"
    args = ["run", source, output, *engine_args(tiny_llama_dir), "--checkpoint-rows", "2"]

    killed = run(args, crash_at="output_written:1")
    assert killed.returncode == -signal.SIGKILL
    written = output.read_bytes()
    # What a kill part-way through the removal leaves: the manifest (removed last) without
    # some of the parts it lists.
    parts = sorted(checkpoint.glob("part-*.parquet"))
    assert len(parts) == 3
    parts[0].unlink()

    rerun = run(args)

    assert rerun.returncode == 0, rerun.stderr
    summary = summary_of(rerun.stdout)
    assert (summary["status"], summary["rows"]) == ("completed", 6)
    assert output.read_bytes() == written
    assert pq.read_table(output).column("id").to_pylist() == [f"r{i}" for i in range(6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "in.jsonl",
        "out.parquet",
        "out.stats.parquet",
    ]
