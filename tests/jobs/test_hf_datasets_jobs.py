"""Jobs whose INPUT is a Hugging Face dataset: hf://datasets/... from a hub cache (offline)
and a `datasets` save_to_disk directory, end to end through the CLI. They keep input order
and resume after kill -9 exactly as a JSONL or Parquet input does: the output equals the
reference run's (tests/jobs/conftest.py) row for row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hf_layouts import parquet_bytes, write_hub_dataset, write_saved_dataset
from huggingface_hub import constants
from jobs.jobkit import comparable, job_args, killed_part_way, run_cli, summary_of

HUB_GLOB = "hf://datasets/org/prompts/data/train-*.parquet"


def reference_table(reference: dict[str, Path]) -> pa.Table:
    lines = reference["source"].read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return pa.table({"id": [r["id"] for r in rows], "prompt": [r["prompt"] for r in rows]})


@pytest.fixture
def hub(reference: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reference's rows as a hub dataset in an offline hub cache: a train split of two
    Parquet shards (row groups of 16) beside a test split."""
    data = reference_table(reference)
    first, second = data.slice(0, 70), data.slice(70)
    cache = tmp_path / "hub"
    files = {
        "data/train-00000-of-00002.parquet": parquet_bytes(first.to_pydict(), row_group_size=16),
        "data/train-00001-of-00002.parquet": parquet_bytes(second.to_pydict(), row_group_size=16),
        "data/test-00000-of-00001.parquet": parquet_bytes({"id": ["x"], "prompt": ["unused"]}),
    }
    write_hub_dataset(cache, "org/prompts", files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # the child processes'
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # this process's
    return cache


def test_a_saved_dataset_gives_the_reference_rows_and_hub_inputs_fail_in_one_line(
    tiny_llama_dir: Path, reference: dict[str, Path], hub: Path, tmp_path: Path
) -> None:
    saved = write_saved_dataset(tmp_path / "saved", reference_table(reference), 3, batch_rows=7)
    output = tmp_path / "saved.parquet"
    result = run_cli(*job_args(tiny_llama_dir, saved, output))
    assert result.exit_code == 0, result.stderr
    assert comparable(output) == comparable(reference["reference"])

    whole_repo = run_cli(
        *job_args(tiny_llama_dir, "hf://datasets/org/prompts", tmp_path / "x.parquet")
    )
    assert whole_repo.exit_code == 1
    assert whole_repo.stderr == (
        "Error: hf://datasets/org/prompts holds the splits train, test: name one, as a file or "
        "a glob (train: hf://datasets/org/prompts/data/train-*.parquet, "
        "test: hf://datasets/org/prompts/data/test-00000-of-00001.parquet)\n"
    )
    missing = run_cli(*job_args(tiny_llama_dir, "hf://datasets/org/absent", tmp_path / "y.parquet"))
    assert missing.exit_code == 1
    assert missing.stderr.startswith(
        "Error: dataset org/absent is not in the local Hugging Face cache"
    )
    assert missing.stderr.count("\n") == 1


def test_a_killed_hub_dataset_job_resumes_to_the_reference_rows(
    tiny_llama_dir: Path, reference: dict[str, Path], hub: Path, tmp_path: Path
) -> None:
    job = {
        "source": HUB_GLOB,
        "output": tmp_path / "out.parquet",
        "checkpoint": tmp_path / ".out.parquet.ckpt",
    }
    args, saved = killed_part_way(tiny_llama_dir, job)  # type: ignore[arg-type]
    assert 0 < saved < 120

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == saved
    assert comparable(job["output"]) == comparable(reference["reference"])
