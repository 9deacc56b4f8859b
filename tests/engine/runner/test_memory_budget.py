"""KV pool sizing: the arithmetic with injected numbers (the CUDA path needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.runner import memory_budget
from astrai_batch.engine.runner.memory_budget import (
    GIB,
    available_ram,
    capped,
    cpu_kv_budget,
    default_kv_budget,
    gpu_kv_budget,
)
from astrai_batch.errors import ConfigError


def test_gpu_budget_is_utilization_of_total_less_weights_and_activations() -> None:
    # an H200-like card: 141 GiB, 0.9 of it allowed, 2.5 GiB of weights, 3 GiB of activations
    budget = gpu_kv_budget(
        total_bytes=141 * GIB,
        utilization=0.9,
        weights_bytes=5 * GIB // 2,
        activation_peak_bytes=3 * GIB,
    )
    assert budget == int(141 * GIB * 0.9) - 5 * GIB // 2 - 3 * GIB


def test_gpu_budget_that_leaves_nothing_is_refused_in_the_users_terms() -> None:
    with pytest.raises(ConfigError) as raised:
        gpu_kv_budget(
            total_bytes=16 * GIB, utilization=0.5, weights_bytes=7 * GIB, activation_peak_bytes=GIB
        )
    assert str(raised.value) == (
        "gpu_memory_utilization 0.5 leaves no room for the KV cache: 8.00 GiB of 16.00 GiB "
        "allowed, the weights take 7.00 GiB and a step's activations 1.00 GiB; raise "
        "--gpu-memory-utilization, lower --max-num-batched-tokens, or set --kv-cache-memory"
    )


@pytest.mark.parametrize("value", [0, 1.5, -0.1, True, "0.9"])
def test_utilization_outside_0_1_is_refused(value) -> None:
    with pytest.raises(ConfigError) as raised:
        EngineConfig(gpu_memory_utilization=value)
    assert str(raised.value) == f"gpu_memory_utilization must be a number in (0, 1], got {value!r}"


def test_cpu_budget_is_a_share_of_available_ram_and_capped_by_what_sequences_use() -> None:
    assert cpu_kv_budget(20 * GIB) == 6 * GIB
    assert capped(12 * GIB, bytes_per_page=1024, max_num_seqs=4, pages_per_seq=8) == 4 * 8 * 1024
    assert capped(1000, bytes_per_page=1024, max_num_seqs=4, pages_per_seq=8) == 1000


def test_cpu_default_reads_available_ram(monkeypatch) -> None:
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 10 * GIB)
    never = lambda: pytest.fail("the CPU path profiles nothing")  # noqa: E731
    budget = default_kv_budget(
        torch.device("cpu"), gpu_memory_utilization=0.9, profile_activation_peak=never
    )
    assert budget == 3 * GIB


def test_available_ram_reads_meminfo_without_psutil(monkeypatch, tmp_path) -> None:
    import sys

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   1234 kB\n")
    monkeypatch.setitem(sys.modules, "psutil", None)  # import fails
    monkeypatch.setattr(memory_budget, "_MEMINFO", meminfo)
    assert available_ram() == 1234 * 1024


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_activation_peak_is_profiled() -> None:
    from astrai_batch.bench.random_models import TINY, build_model
    from astrai_batch.engine.runner.memory_budget import profile_activation_peak

    loaded = build_model(TINY, device="cuda")
    pool_args = dict(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=16,
        dtype=torch.float32,
        device=torch.device("cuda"),
    )
    peak = profile_activation_peak(
        loaded.model, pool_args, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=1024
    )
    assert peak > 512 * loaded.model.config.hidden_size * 4
