"""Ctrl-C or SIGTERM while the model loads (the first seconds of every run): a real signal to a
real process ends it with a summary saying `interrupted` on stdout, its exit code, and nothing
left beside the output, so a rerun with other options is not refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs.jobkit import (
    REPO_ROOT,
    engine_args,
    listing,
    question,
    run_cli,
    summary_of,
    write_jsonl,
)

from astrai_batch.jobs.crash_points import PAUSE_ENV


def start_paused(*args: object) -> subprocess.Popen[str]:
    """The CLI as a process that stops (sleeps) right before it loads the model."""
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        PAUSE_ENV: "model_load:60",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "astrai_batch.cli", *(str(arg) for arg in args)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(process: subprocess.Popen[str], wanted: str, timeout: float = 60) -> list[str]:
    """stderr lines up to the one containing `wanted`."""
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            pytest.fail(f"the process ended first: {''.join(lines)}")
        lines.append(line)
        if wanted in line:
            return lines
    process.kill()
    pytest.fail(f"no {wanted!r} within {timeout} s")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_model_loads_leaves_a_summary_and_nothing_else(
    tiny_llama_dir: Path, tmp_path: Path, signum: int, code: int
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(3)])
    output = tmp_path / "out.parquet"
    args = ["run", source, output, *engine_args(tiny_llama_dir)[:-1], "--threads", "1"]
    process = start_paused(*args)
    before = wait_for_line(process, "pausing at model_load")
    assert any("loading model" in line for line in before)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    summary = summary_of(stdout)
    name = signal.Signals(signum).name
    assert summary["status"] == "interrupted" and summary["exit_code"] == code
    assert summary["message"] == f"interrupted by {name} before any row finished; nothing was saved"
    assert (summary["rows"], summary["rows_done"], summary["output"]) == (3, 0, None)
    assert stderr.strip().splitlines()[-1] == f"astrai-batch: {summary['message']}"
    assert listing(tmp_path) == ["in.jsonl"]  # no output, no stats, no .out.parquet.ckpt

    # A rerun with another result option is not refused.
    rerun = run_cli(*args, "--max-tokens", "2")
    assert rerun.exit_code == 0, rerun.stderr
    assert summary_of(rerun.stdout)["rows_done"] == 3
