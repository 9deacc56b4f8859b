"""`scripts/gpu_check --device cpu`: every step runs on the tiny model, writes its JSON with a
verdict, and the exit code says whether all passed (a crash or a missing verdict fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astrai_batch.bench.check_steps import CheckRun
from astrai_batch.bench.gpu_check import main

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


def test_every_step_wrote_its_file_with_a_verdict(check_dir: Path) -> None:
    names = {
        "machine",
        "exactness_tiny_float32",
        "exactness_tiny_bfloat16",
        "bench_shared_prefix",
        "cuda_graphs",
        "cuda_graphs_windowed",
        "batch_invariance",
        "host_overhead",
        "attention_backends",
        "memory",
        "tensor_parallel",
    }
    assert {p.stem for p in check_dir.glob("*.json")} == names | {"summary"}
    summary = read(check_dir, "summary")
    assert summary["device"] == "cpu"
    assert summary["passed"] is True and summary["failed"] == []
    assert set(summary["steps"]) == names
    for name in names:
        step = read(check_dir, name)
        assert step["passed"] is True, name
        assert summary["steps"][name] == {"passed": True, "seconds": step["seconds"]}
    assert summary["seconds"] <= summary["time_limit_seconds"] == 900.0
    assert read(check_dir, "machine")["machine"]["device"] == "cpu"


def test_tensor_parallel_step_is_skipped_without_two_gpus(check_dir: Path) -> None:
    result = read(check_dir, "tensor_parallel")
    assert result["skipped"] == (
        "needs CUDA; on CPU the test suite checks tensor parallelism (gloo)"
    )
    assert result["passed"] is True  # nothing to judge here, as attention_backends without kernels


def test_float32_greedy_is_token_for_token_transformers(check_dir: Path) -> None:
    result = read(check_dir, "exactness_tiny_float32")
    assert result["passed"] is True
    assert result["exact_rows"] == result["rows"] == 4
    # end of sequence is ignored on both sides: every row compares all 8 tokens
    assert [row["compared"] for row in result["per_row"]] == [8, 8, 8, 8]
    assert result["token_agreement"] == 1.0
    bf16 = read(check_dir, "exactness_tiny_bfloat16")
    assert bf16["dtype"] == "bfloat16"
    assert bf16["token_agreement"] >= bf16["min_token_agreement"] == 0.5


def test_bench_and_host_figures_are_recorded(check_dir: Path) -> None:
    bench = read(check_dir, "bench_shared_prefix")
    assert set(bench["systems"]) == {"astrai", "hf-generate", "hf-generate-batch"}
    assert bench["prompts"] == 4
    for figures in bench["systems"].values():
        assert figures["wall_seconds"] > 0
    host = read(check_dir, "host_overhead")
    assert host["num_seqs"] == 16
    assert host["context"] == 64
    assert 0 < host["host_ms_per_step"] <= host["host_ms_budget"] == 50.0
    assert host["peak_device_memory_bytes"] is None  # no GPU here
    assert bench["ratio_vs_generate"] > 0 and bench["min_ratio_vs_generate"] == 0.0
    memory = read(check_dir, "memory")
    assert memory["measured"] is None and memory["why"] == "no device memory counters on cpu"


def test_kernel_backends_say_why_they_did_not_run(check_dir: Path) -> None:
    result = read(check_dir, "attention_backends")
    assert result["backends"] == {
        "flashinfer": {"status": "needs a CUDA device"},
        "flash-attn": {"status": "needs a CUDA device"},
    }
    assert "bench" not in result and result["checked"] == [] and result["passed"] is True


def test_graph_path_gives_the_eager_tokens(check_dir: Path) -> None:
    result = read(check_dir, "cuda_graphs")
    assert result["passed"] is True
    assert result["same_tokens_rows"] == result["prompts"] == 4
    on = result["graphs_on"]
    assert on["captured"] is False and on["captures"] == 0  # CPU: the static path, eager
    assert on["bucketed_steps_all_runs"] > 0
    assert "captured" not in result["graphs_off"]
    windowed = read(check_dir, "cuda_graphs_windowed")
    assert windowed["model"] == "gemma2-windowed-tiny"
    assert windowed["passed"] is True and windowed["same_tokens_rows"] == 4
    assert windowed["graphs_on"]["bucketed_steps_all_runs"] > 0


def test_rows_alone_and_in_a_crowd_have_the_same_logits(check_dir: Path) -> None:
    result = read(check_dir, "batch_invariance")
    assert (result["passed"], result["difference"]) == (True, None)
    assert (result["prompts"], result["watched_rows"], result["numerics"]) == (8, 4, "invariant")
    assert [c["token_budget"] for c in result["crowds"]] == [64, 256, 1024]


def forced_steps(out_dir: Path, device: str, log, only) -> dict:
    run = CheckRun(out_dir, torch.device(device), log, time_limit=600.0)
    run.step("fine", lambda: {"passed": True, "figure": 1})
    run.step("broken", lambda: {"passed": False, "figure": 2})
    run.step("unjudged", lambda: {"figure": 3})
    run.step("crashed", lambda: {"figure": 1 // 0})
    return run.summary()


def test_a_failed_crashed_or_unjudged_step_fails_the_check(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path), "--device", "cpu"], run=forced_steps) == 1
    out = capsys.readouterr().out
    assert out == f"gpu_check: FAILED (broken, unjudged, crashed); results in {tmp_path}\n"
    summary = read(tmp_path, "summary")
    assert summary["failed"] == ["broken", "unjudged", "crashed"]
    assert {name: step["passed"] for name, step in summary["steps"].items()} == {
        "fine": True,
        "broken": False,
        "unjudged": False,
        "crashed": False,
    }
    unjudged = read(tmp_path, "unjudged")
    assert (unjudged["figure"], unjudged["verdict"]) == (
        3,
        "missing (the step returned passed=None)",
    )
    assert (
        read(tmp_path, "crashed")["error"]
        == "ZeroDivisionError: integer division or modulo by zero"
    )


def test_a_check_over_its_time_limit_fails(tmp_path: Path) -> None:
    run = CheckRun(tmp_path, torch.device("cpu"), lambda _m: None, time_limit=0.0)
    run.step("fine", lambda: {"passed": True})
    summary = run.summary()
    assert (summary["passed"], summary["failed"]) == (False, ["time_limit"])


def test_only_the_named_steps_run(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path), "--device", "cpu", "--only", "machine"]) == 0
    assert capsys.readouterr().out == f"gpu_check: passed; results in {tmp_path}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["machine.json", "summary.json"]
