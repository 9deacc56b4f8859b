"""Helpers shared by the job tests: small input files, running the CLI in-process or as a
process, stopping a job part-way (the resume tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from astrai_batch.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]

SYSTEM_PROMPTS = (
    "You are a helpful assistant. Answer the question briefly and precisely.",
    "Summarise the following article about batch inference and prefix caching.",
    "Translate to German: the weather is nice today and we go for a walk.",
)


def question(index: int) -> str:
    return f"Question {index}: what is {index % 7} plus {index % 5}?"


def shared_prefix_prompts(count: int) -> list[str]:
    """Prompts that share one of three long prefixes, in an order that mixes them."""
    return [f"{SYSTEM_PROMPTS[(i * 2) % 3]} {question(i)}" for i in range(count)]


def engine_args(model_dir: Path, *extra: str) -> list[str]:
    """Fast settings for the tiny model: a few tokens, a small KV pool, no progress."""
    return [
        "--model",
        str(model_dir),
        "--max-tokens",
        "4",
        "--kv-cache-memory",
        "8MiB",
        "--quiet",
        *extra,
    ]


def write_jsonl(path: Path, lines: Sequence[Any]) -> Path:
    """Dicts become JSON lines; strings are written verbatim (for malformed lines)."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def listing(directory: Path) -> list[str]:
    """Every name in `directory`, hidden ones included, sorted."""
    return sorted(entry.name for entry in directory.iterdir())


def run_cli(*args: Any) -> Result:
    """`astrai-batch ARGS` in-process; returns click's Result (stdout and stderr apart)."""
    return CliRunner().invoke(main, [str(arg) for arg in args], catch_exceptions=False)


def start_process(*args: Any) -> subprocess.Popen[str]:
    """`python -m astrai_batch.cli ARGS` as a child process, stdout/stderr captured."""
    # One torch thread: on a busy machine a spinning two-thread pool slows a child tenfold.
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "astrai_batch.cli", *(str(arg) for arg in args)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def summary_of(stdout: str) -> dict[str, Any]:
    """The JSON summary: the last line of stdout."""
    return json.loads(stdout.strip().splitlines()[-1])


# -- resuming: a job of ROWS rows with small windows, stopped part-way ------------------------

ROWS = 120


def job_args(model_dir: Path, source: Path, output: Path, *extra: str) -> list[Any]:
    """Small windows and frequent checkpoints, so every kill lands inside a window; seeded
    sampling, so rows reproduce only if each keeps its own random stream across restarts."""
    return [
        "run",
        source,
        output,
        *engine_args(model_dir),
        "--group-window",
        "40",
        "--checkpoint-rows",
        "4",
        "--temperature",
        "0.8",
        "--seed",
        "11",
        *extra,
    ]


def saved_parts(checkpoint_dir: Path) -> int:
    try:
        return len(json.loads((checkpoint_dir / "manifest.json").read_text())["parts"])
    except (OSError, ValueError):
        return 0  # not created yet (or, on some filesystems, mid-rename)


def saved_rows(checkpoint_dir: Path) -> int:
    manifest = json.loads((checkpoint_dir / "manifest.json").read_text())
    return sum(part["stats"]["input_rows"] for part in manifest["parts"])


def stop_after_parts(
    args: list[Any], checkpoint_dir: Path, parts: int, signum: int, timeout: float = 120
):
    """Start the job as a process and send `signum` once the checkpoint lists `parts` parts."""
    process = start_process(*args)
    wait_for_parts(process, checkpoint_dir, parts, timeout)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout, stderr


def wait_for_parts(
    process: subprocess.Popen[str], checkpoint_dir: Path, parts: int, timeout: float = 120
) -> None:
    """Wait until the running job `process` has saved `parts` checkpoint parts."""
    deadline = time.monotonic() + timeout
    while saved_parts(checkpoint_dir) < parts:
        if process.poll() is not None:
            pytest.fail(f"the job ended before {parts} parts: {process.communicate()[1]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {parts} checkpoint parts within {timeout:.0f} s")
        time.sleep(0.01)


def comparable(path: Path, filesystem: Any = None) -> list[dict[str, Any]]:
    """The output's rows without `cached_tokens` (a restarted process starts cold); the
    file may be on a pyarrow `filesystem`."""
    rows = pq.read_table(path, filesystem=filesystem).to_pylist()
    return [{k: v for k, v in row.items() if k != "cached_tokens"} for row in rows]


def killed_part_way(model_dir: Path, job: dict[str, Path], parts: int = 3) -> tuple[list[Any], int]:
    """Run `job` (see the `job` fixture) as a process and kill -9 it once `parts` parts are
    saved. Returns the job's arguments and the number of rows saved."""
    args = job_args(model_dir, job["source"], job["output"])
    returncode, _, _ = stop_after_parts(args, job["checkpoint"], parts, signal.SIGKILL)
    assert returncode == -signal.SIGKILL
    assert not job["output"].exists()
    return args, saved_rows(job["checkpoint"])
