"""`--device auto` / `--dtype auto`: resolved once, the same job whichever spelling is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from jobs.jobkit import engine_args, run_cli, write_jsonl

from astrai_batch.bench.config import BenchConfig
from astrai_batch.engine.device_choice import resolve_device_name, resolve_dtype_name
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import JobConfig

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")


def test_auto_picks_cuda_when_there_is_one_and_its_dtype() -> None:
    assert resolve_device_name("auto", cuda=True) == "cuda"
    assert resolve_device_name(" AUTO ", cuda=False) == "cpu"
    assert resolve_device_name("cuda:1", cuda=False) == "cuda:1"  # given names are kept
    assert resolve_dtype_name("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype_name("auto", "cpu") == "float32"
    assert resolve_dtype_name("float16", "cpu") == "float16"


@NO_CUDA
def test_job_defaults_resolve_to_this_machine() -> None:
    config = JobConfig()
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert config.model_options()["device"] == "cpu"
    # ray workers get a GPU only through worker_gpus; that decides auto there
    ray = JobConfig(executor="ray", worker_gpus=1.0)
    assert (ray.device, ray.dtype) == ("cuda", "bfloat16")
    assert JobConfig(executor="ray", device="auto").device == "cpu"


@NO_CUDA
def test_auto_and_its_resolved_names_are_the_same_job() -> None:
    auto = JobConfig.from_options({"device": "auto", "dtype": "auto"})
    named = JobConfig.from_options({"device": "cpu", "dtype": "float32"})
    assert auto.result_options() == named.result_options()
    assert auto.to_dict() == named.to_dict()


@NO_CUDA
def test_graphs_on_auto_name_the_resolved_device() -> None:
    with pytest.raises(ConfigError) as caught:
        JobConfig(cuda_graphs=True)
    assert str(caught.value) == "cuda_graphs needs device cuda, got device cpu"


@NO_CUDA
def test_bench_defaults_resolve_too() -> None:
    config = BenchConfig(model="m")
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert BenchConfig(model="m", dtype="bfloat16").dtype == "bfloat16"


def test_run_help_shows_auto() -> None:
    text = " ".join(run_cli("run", "--help").stdout.split())
    assert "cuda, cpu, cuda:N, or auto (cuda when available, else cpu). [default: auto]" in text
    assert "auto (bfloat16 on CUDA, else float32). [default: auto]" in text


@NO_CUDA
def test_summary_shows_the_resolved_device_and_dtype(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a b c"}])
    result = run_cli("run", source, tmp_path / "out.parquet", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["device"], summary["dtype"]) == ("cpu", "float32")
