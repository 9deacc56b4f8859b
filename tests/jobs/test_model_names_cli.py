"""A mistyped model name fails at once, in one line naming close matches, and an
unreachable hub costs no retries: a cached hub id runs from the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jobs.jobkit import REPO_ROOT, engine_args, question, read_rows, summary_of, write_jsonl
from jobs.test_run_options import fake_hub_cache

# A hub that refuses connections at once (the discard port on loopback), as a machine
# without internet meets huggingface.co; no proxy, so the client would try it directly.
UNREACHABLE = {"HF_ENDPOINT": "http://127.0.0.1:9", "HTTPS_PROXY": "", "ALL_PROXY": ""}


def run_process(args: list[object], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "astrai_batch.cli", *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_typo_fails_in_one_line_and_a_cached_hub_id_runs_without_the_hub(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    fake_hub_cache(cache, "astrai/tiny-llama", {"main": tiny_llama_dir})
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(2)])
    env = {**UNREACHABLE, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": ""}

    typo = run_process(["run", source, tmp_path / "a.parquet", "--model", "smollm2-136m"], env)
    assert typo.returncode == 1
    assert typo.stdout == ""
    assert typo.stderr == (
        "Error: Model not found: 'smollm2-136m' is not a local path, a model alias or a cached "
        "hub id, and the hub cannot be reached; did you mean smollm2-135m or "
        "smollm2-135m-instruct?\n"
    )

    args = ["run", source, tmp_path / "b.parquet", *engine_args("astrai/tiny-lama")]
    near = run_process(args, env)
    assert near.returncode == 1
    assert near.stderr.splitlines() == [
        "Error: Model not found: 'astrai/tiny-lama' is not a local path, a model alias or a "
        "cached hub id, and the hub cannot be reached; did you mean astrai/tiny-llama?"
    ]

    args = ["run", source, tmp_path / "c.parquet", *engine_args("astrai/tiny-llama")]
    cached = run_process(args, env)
    assert cached.returncode == 0, cached.stderr
    assert "Retry" not in cached.stderr and "thrown while requesting" not in cached.stderr
    assert summary_of(cached.stdout)["model"] == "astrai/tiny-llama"
    assert len(read_rows(tmp_path / "c.parquet")) == 2
