"""Packed bfloat16 weights (`packed_gemm`): F.linear's bits or not used at all."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from invariance_kit import assert_same_rows, invariance_prompts, mixed_requests, run_capturing
from torch import nn

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics import packed_gemm
from astrai_batch.engine.numerics.blas_rows import PROBE_COLUMNS, RowScheme
from astrai_batch.engine.numerics.packed_gemm import (
    SWITCH_ENV_VAR,
    memory_allows,
    pack,
    packing_matches,
    packing_supported,
)
from astrai_batch.engine.runner import invariant_linear
from astrai_batch.engine.runner.invariant_linear import (
    RowTiledLinear,
    pack_plain_linears,
    pack_weights,
    set_row_tiling,
)

CPU = torch.device("cpu")


needs_packing = pytest.mark.skipif(
    not packing_supported(torch.bfloat16, CPU), reason="this torch or CPU packs no bfloat16 weights"
)


@needs_packing
@pytest.mark.parametrize("shape", [(576, 192, False), (1536, 576, False), (96, 160, True)])
def test_a_verified_shape_gives_f_linear_bits_at_random_row_counts(shape):
    k, n, bias = shape
    assert packing_matches(k, n, bias)
    seed = random.randrange(1 << 30)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator).to(torch.bfloat16)
    b = torch.randn(n, generator=generator).to(torch.bfloat16) if bias else None
    packed = pack(weight)
    counts = [*range(1, 12), *torch.randint(12, 1100, (8,), generator=generator).tolist()]
    for m in counts:
        rows = (torch.randn(m, k, generator=generator) * 4).to(torch.bfloat16)
        got = packed_gemm.packed_gemm(rows, packed, b)
        assert torch.equal(got, F.linear(rows, weight, b)), f"seed {seed}, {m} rows"


@needs_packing
@pytest.mark.parametrize("where", ["a small row count", "a column past the probe's width"])
def test_a_gemm_whose_bits_differ_is_declined(monkeypatch, where):
    real = packed_gemm.packed_gemm

    def off_by_one_bit(rows, packed, bias):
        out = real(rows, packed, bias).clone()
        m, n = out.shape
        if where == "a small row count" and m == 5:
            out[4, 3] = out[4, 3].view(torch.int16).add(1).view(torch.bfloat16)
        if where == "a column past the probe's width" and n > PROBE_COLUMNS:
            out[0, n - 1] = out[0, n - 1].view(torch.int16).add(1).view(torch.bfloat16)
        return out

    monkeypatch.setattr(packed_gemm, "packed_gemm", off_by_one_bit)
    assert not packing_matches(64, PROBE_COLUMNS + 64, False)


def test_memory_allows_a_quarter_of_what_is_available(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8192 kB\nMemAvailable:    4096 kB\n", encoding="ascii")
    assert memory_allows(1 << 20, meminfo)
    assert not memory_allows((1 << 20) + 1, meminfo)
    meminfo.write_text("MemTotal: 8192 kB\n", encoding="ascii")
    assert not memory_allows(1, meminfo)
    assert not memory_allows(1, tmp_path / "absent")


def test_packing_is_only_for_cpu_bfloat16_and_can_be_switched_off(monkeypatch):
    assert not packing_supported(torch.float32, CPU)
    assert not packing_supported(torch.bfloat16, torch.device("meta"))
    monkeypatch.setenv(SWITCH_ENV_VAR, "0")
    assert not packing_supported(torch.bfloat16, CPU)


def _tiled_model() -> nn.Module:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 96, bias=False), nn.Linear(96, 8))
    model = model.to(torch.bfloat16)
    set_row_tiling(model, True, RowScheme.tiles(16))
    return model


@needs_packing
def test_packed_layers_compute_what_unpacked_ones_do_and_keep_their_copies():
    model, memo = _tiled_model(), {}
    x = torch.randn(37, 64).to(torch.bfloat16)
    with torch.inference_mode():
        before = model(x)
        assert pack_weights(model, memo) == 2  # the 8-column layer runs 64 wide: not packed
        assert [m._packed is not None for m in model] == [True, True, False]
        assert torch.equal(model(x), before)
        copies = [m._packed for m in model[:2]]
        set_row_tiling(model, False)
        set_row_tiling(model, True, RowScheme.tiles(16))  # fresh layers, the same weights
        assert pack_weights(model, memo) == 2
        assert all(m._packed is c for m, c in zip(model[:2], copies, strict=True))
        assert torch.equal(model(x), before)


@needs_packing
def test_fast_numerics_swap_only_the_layers_that_pack(monkeypatch):
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 8)).to(torch.bfloat16)
    x = torch.randn(3, 50, 64).to(torch.bfloat16)
    with torch.inference_mode():
        before = model(x)
        monkeypatch.setenv(SWITCH_ENV_VAR, "0")
        assert pack_plain_linears(model, {}) == 0
        monkeypatch.delenv(SWITCH_ENV_VAR)
        assert [type(m) for m in model] == [nn.Linear, nn.Linear]
        assert pack_plain_linears(model, {}) == 1  # the 8-column layer stays plain
        assert type(model[0]) is RowTiledLinear and type(model[1]) is nn.Linear
        assert model[0].scheme == RowScheme.whole() and model[0]._packed is not None
        assert torch.equal(model(x), before)
        assert set_row_tiling(model, False) == 1 and type(model[0]) is nn.Linear


@needs_packing
def test_no_layer_is_packed_where_the_copies_do_not_fit(monkeypatch):
    monkeypatch.setattr(invariant_linear, "memory_allows", lambda nbytes: False)
    model = _tiled_model()
    assert pack_weights(model, {}) == 0
    assert all(m._packed is None for m in model)


@needs_packing
def test_an_invariant_engine_after_a_fast_one_runs_its_probed_scheme(tiny_llama_dir):
    """Fast numerics leave one-GEMM packed layers; the next invariant engine replaces them
    with its probed scheme, and generates what it does on a fresh model."""
    loaded = load_model(tiny_llama_dir, dtype="bfloat16")
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=4)
    config = EngineConfig(page_size=8, num_pages=128)
    alone, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
    EngineCore(loaded, EngineConfig(page_size=8, num_pages=64, numerics="fast"))
    after_fast, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
    tiled = [m for m in loaded.model.modules() if isinstance(m, RowTiledLinear)]
    assert tiled and not any(m.scheme == RowScheme.whole() for m in tiled)
    assert any(m._packed is not None for m in tiled)
    assert_same_rows(alone, after_fast, range(6))


@needs_packing
def test_packing_switched_off_changes_no_token(tiny_llama_dir, monkeypatch):
    loaded = load_model(tiny_llama_dir, dtype="bfloat16")
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=5)
    for numerics in ("invariant", "fast"):
        config = EngineConfig(page_size=8, num_pages=128, numerics=numerics)
        packed, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
        monkeypatch.setenv(SWITCH_ENV_VAR, "0")
        plain, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
        monkeypatch.delenv(SWITCH_ENV_VAR)
        assert_same_rows(plain, packed, range(6))
