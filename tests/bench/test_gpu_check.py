"""`scripts/gpu_check --device cpu`: every step runs on the tiny model and writes its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check"


@pytest.fixture(scope="module")
def check_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"gpu_check: passed; results in {out}\n"
    return out


def read(directory: Path, name: str) -> dict:
    return json.loads((directory / f"{name}.json").read_text())


def test_every_step_wrote_its_file(check_dir: Path) -> None:
    names = {
        "machine",
        "exactness_tiny_float32",
        "exactness_tiny_bfloat16",
        "bench_shared_prefix",
        "cuda_graphs",
        "host_overhead",
        "attention_backends",
        "tensor_parallel",
    }
    assert {p.stem for p in check_dir.glob("*.json")} == names | {"summary"}
    summary = read(check_dir, "summary")
    assert summary["device"] == "cpu"
    assert summary["passed"] is True
    assert set(summary["files"]) == names
    assert read(check_dir, "machine")["machine"]["device"] == "cpu"


def test_tensor_parallel_step_is_skipped_without_two_gpus(check_dir: Path) -> None:
    result = read(check_dir, "tensor_parallel")
    assert result["skipped"] == (
        "needs CUDA; on CPU the test suite checks tensor parallelism (gloo)"
    )
    assert "passed" not in result


def test_float32_greedy_is_token_for_token_transformers(check_dir: Path) -> None:
    result = read(check_dir, "exactness_tiny_float32")
    assert result["passed"] is True
    assert result["exact_rows"] == result["rows"] == 4
    # end of sequence is ignored on both sides: every row compares all 8 tokens
    assert [row["compared"] for row in result["per_row"]] == [8, 8, 8, 8]
    assert result["token_agreement"] == 1.0
    bf16 = read(check_dir, "exactness_tiny_bfloat16")
    assert bf16["dtype"] == "bfloat16"
    assert 0.0 <= bf16["token_agreement"] <= 1.0
    assert "passed" not in bf16  # an agreement rate is reported, not judged


def test_bench_and_host_figures_are_recorded(check_dir: Path) -> None:
    bench = read(check_dir, "bench_shared_prefix")
    assert set(bench["systems"]) == {"astrai", "hf-generate", "hf-generate-batch"}
    assert bench["prompts"] == 4
    for figures in bench["systems"].values():
        assert figures["wall_seconds"] > 0
    host = read(check_dir, "host_overhead")
    assert host["num_seqs"] == 16
    assert host["context"] == 64
    assert host["host_ms_per_step"] > 0
    assert host["peak_device_memory_bytes"] is None  # no GPU here


def test_kernel_backends_say_why_they_did_not_run(check_dir: Path) -> None:
    result = read(check_dir, "attention_backends")
    assert result["backends"] == {
        "flashinfer": {"status": "needs a CUDA device"},
        "flash-attn": {"status": "needs a CUDA device"},
    }
    assert "bench" not in result and "passed" not in result


def test_graph_path_gives_the_eager_tokens(check_dir: Path) -> None:
    result = read(check_dir, "cuda_graphs")
    assert result["passed"] is True
    assert result["same_tokens_rows"] == result["prompts"] == 4
    on = result["graphs_on"]
    assert on["captured"] is False and on["captures"] == 0  # CPU: the static path, eager
    assert on["bucketed_steps_all_runs"] > 0
    assert "captured" not in result["graphs_off"]
