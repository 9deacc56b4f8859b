"""`--device auto` / `--dtype auto`: resolved once, the same job whichever spelling is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from jobs.jobkit import engine_args, run_cli, write_jsonl

from astrai_batch.bench.config import BenchConfig
from astrai_batch.engine import device_choice
from astrai_batch.engine.device_choice import choose_dtype, resolve_device_name, resolve_dtype_name
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import JobConfig

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
SAPPHIRE_RAPIDS = frozenset(["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"])
ZEN4 = frozenset(["avx2", "avx512f", "avx512_bf16", "avx512_vnni"])
ICE_LAKE = frozenset(["avx2", "avx512f", "avx512_vnni", "avx512_ifma"])


@pytest.fixture
def cpu_flags(monkeypatch):
    """Sets the flags this machine's CPU reports (as /proc/cpuinfo would)."""

    def use(flags: frozenset[str]) -> None:
        monkeypatch.setattr(device_choice, "host_cpu_flags", lambda: flags)

    use(ICE_LAKE)  # the tests' default: a CPU without bf16 dot products
    return use


def test_auto_on_the_cpu_is_bfloat16_where_it_has_native_bf16_dot_products(cpu_flags) -> None:
    assert choose_dtype("auto", "cpu", cpu_flags=SAPPHIRE_RAPIDS) == (
        "bfloat16",
        "auto: this CPU has native bf16 dot products (amx_bf16, avx512_bf16)",
    )
    assert choose_dtype("auto", "cpu", cpu_flags=ZEN4) == (
        "bfloat16",
        "auto: this CPU has native bf16 dot products (avx512_bf16)",
    )
    assert choose_dtype("auto", "cpu", cpu_flags=ICE_LAKE) == (
        "float32",
        "auto: this CPU has no native bf16 dot products (avx512_bf16, amx_bf16)",
    )
    assert choose_dtype("auto", "cpu", cpu_flags=frozenset()) == choose_dtype(
        "auto", "cpu", cpu_flags=ICE_LAKE
    )
    assert choose_dtype("float32", "cpu", cpu_flags=SAPPHIRE_RAPIDS) == ("float32", "given")
    # Ray's CPU workers may be other machines: float32, whatever the driver has
    assert choose_dtype("auto", "cpu", cpu_flags=SAPPHIRE_RAPIDS, local=False) == (
        "float32",
        "auto: the workers' CPUs are not known here",
    )
    # without injected flags: this machine's, through the configurations too
    cpu_flags(SAPPHIRE_RAPIDS)
    assert resolve_dtype_name("auto", "cpu") == "bfloat16"
    assert JobConfig().dtype == "bfloat16" and BenchConfig(model="m").dtype == "bfloat16"
    assert JobConfig(executor="ray").dtype == "float32"
    from astrai_batch.engine.model.loaded import resolve_dtype

    assert resolve_dtype("auto") == torch.bfloat16
    cpu_flags(ZEN4)
    assert JobConfig().dtype_choice == "auto: this CPU has native bf16 dot products (avx512_bf16)"
    cpu_flags(ICE_LAKE)
    assert (JobConfig().dtype, resolve_dtype("auto")) == ("float32", torch.float32)


def test_cpu_flags_come_from_the_environment_or_this_machine(monkeypatch) -> None:
    monkeypatch.setenv(device_choice.CPU_FLAGS_ENV, "avx2  amx_bf16")
    assert device_choice.host_cpu_flags() == {"avx2", "amx_bf16"}
    assert resolve_dtype_name("auto", "cpu") == "bfloat16"
    monkeypatch.delenv(device_choice.CPU_FLAGS_ENV)
    flags = device_choice.host_cpu_flags()
    assert flags == device_choice.proc_cpu_flags()
    assert not flags or "fpu" in flags or "sse2" in flags  # x86 Linux names, when any


def test_auto_picks_cuda_when_there_is_one_and_its_dtype(cpu_flags) -> None:
    assert resolve_device_name("auto", cuda=True) == "cuda"
    assert resolve_device_name(" AUTO ", cuda=False) == "cpu"
    assert resolve_device_name("cuda:1", cuda=False) == "cuda:1"  # given names are kept
    assert resolve_dtype_name("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype_name("auto", "cpu") == "float32"
    assert resolve_dtype_name("float16", "cpu") == "float16"


@NO_CUDA
def test_job_defaults_resolve_to_this_machine(cpu_flags) -> None:
    config = JobConfig()
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert config.model_options()["device"] == "cpu"
    # ray workers get a GPU only through worker_gpus; that decides auto there
    ray = JobConfig(executor="ray", worker_gpus=1.0)
    assert (ray.device, ray.dtype) == ("cuda", "bfloat16")
    assert JobConfig(executor="ray", device="auto").device == "cpu"


@NO_CUDA
def test_auto_and_its_resolved_names_are_the_same_job(cpu_flags) -> None:
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
def test_bench_defaults_resolve_too(cpu_flags) -> None:
    config = BenchConfig(model="m")
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert BenchConfig(model="m", dtype="bfloat16").dtype == "bfloat16"


def test_run_help_shows_auto() -> None:
    text = " ".join(run_cli("run", "--help").stdout.split())
    assert "cuda, cpu, cuda:N, or auto (cuda when available, else cpu). [default: auto]" in text
    assert (
        "auto (bfloat16 on CUDA and on CPUs with native bf16 dot products (avx512_bf16, "
        "amx_bf16), else float32). [default: auto]"
    ) in text


@NO_CUDA
def test_summary_shows_the_resolved_device_and_dtype(
    tiny_llama_dir: Path, tmp_path: Path, cpu_flags
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a b c"}])
    result = run_cli("run", source, tmp_path / "out.parquet", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["device"], summary["dtype"]) == ("cpu", "float32")
    assert summary["dtype_choice"] == (
        "auto: this CPU has no native bf16 dot products (avx512_bf16, amx_bf16)"
    )
    cpu_flags(SAPPHIRE_RAPIDS)
    result = run_cli("run", source, tmp_path / "out2.parquet", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["dtype"], summary["dtype_choice"]) == (
        "bfloat16",
        "auto: this CPU has native bf16 dot products (amx_bf16, avx512_bf16)",
    )
