"""Fixtures of the resume tests: an input and the output of an uninterrupted run of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs.jobkit import ROWS, job_args, run_cli, shared_prefix_prompts, write_jsonl


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The input and the output of an uninterrupted run, shared by the tests here."""
    directory = tmp_path_factory.mktemp("reference")
    source = write_jsonl(
        directory / "in.jsonl",
        [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(ROWS))],
    )
    output = directory / "out.parquet"
    result = run_cli(*job_args(tiny_llama_dir, source, output))
    assert result.exit_code == 0, result.stderr
    return {"source": source, "reference": output}


@pytest.fixture
def job(reference: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    output = tmp_path / "out.parquet"
    return {**reference, "output": output, "checkpoint": tmp_path / ".out.parquet.ckpt"}
