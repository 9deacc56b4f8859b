"""Fixtures of the job tests: an input and the output of an uninterrupted run of it (for
the resume tests), and one local Ray for every Ray test."""

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


@pytest.fixture(scope="session")
def ray_address():
    """A local Ray of 2 CPUs, started once for the session (no dashboard, loopback only)."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",  # cluster traffic stays on loopback
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
