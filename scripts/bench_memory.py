"""Peak memory of `astrai-batch run` as the input grows: it should stay flat.

Run: .venv/bin/python scripts/bench_memory.py [--sizes 10000 100000 300000]

For each size, writes a JSONL file of that many tiny prompts, runs the console command on it in
a child process (a tiny random Llama built like the test fixture, `--max-tokens 1`, default
grouping window of 100,000 rows) and prints the child's peak RSS, read with os.wait4. Memory is
bounded by the grouping window, so every size past one window should show about the same peak.
The child runs torch with one thread (OMP_NUM_THREADS=1): on a shared machine, torch's spinning
thread pool can slow a job twentyfold when the cores are busy, which says nothing about memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (10_000, 100_000, 300_000)


def write_prompts(path: Path, rows: int) -> None:
    """Short prompts, a third sharing a prefix, written line by line (never all in memory)."""
    with path.open("w", encoding="utf-8") as handle:
        for index in range(rows):
            prefix = "You are a helpful assistant. " if index % 3 == 0 else ""
            prompt = f"{prefix}Question {index}: what is {index % 97} plus {index % 89}?"
            handle.write(json.dumps({"id": f"q{index}", "prompt": prompt}) + "\n")


def build_tiny_model(directory: Path) -> Path:
    # The test suite's builder: a byte-level BPE tokenizer and a 2-layer random Llama.
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import _save_tiny_model

    directory.mkdir(parents=True, exist_ok=True)
    return _save_tiny_model(directory, "llama")


def run_once(source: Path, output: Path, model: Path, extra: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in bytes, exit status) of one run in a child process."""
    command = [
        sys.executable,
        "-m",
        "astrai_batch.cli",
        "run",
        str(source),
        str(output),
        "--model",
        str(model),
        "--max-tokens",
        "1",
        "--kv-cache-memory",
        "64MiB",
        "--quiet",
        "--overwrite",
        *extra,
    ]
    started = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is in KiB on Linux.
    return time.monotonic() - started, usage.ru_maxrss * 1024, child.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--workdir", type=Path, default=None, help="keep files here")
    parser.add_argument("run_args", nargs="*", help="extra arguments for astrai-batch run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(workdir / "tiny-llama")
        print(f"{'rows':>10} {'seconds':>9} {'rows/s':>8} {'peak RSS MiB':>13}", flush=True)
        for rows in args.sizes:
            source = workdir / f"prompts-{rows}.jsonl"
            write_prompts(source, rows)
            seconds, peak, status = run_once(
                source, workdir / f"out-{rows}.parquet", model, args.run_args
            )
            if status != 0:
                raise SystemExit(f"astrai-batch run exited with {status} on {rows} rows")
            print(
                f"{rows:>10,} {seconds:>9.1f} {rows / seconds:>8.0f} {peak / 2**20:>13.0f}",
                flush=True,
            )
            source.unlink()


if __name__ == "__main__":
    main()
