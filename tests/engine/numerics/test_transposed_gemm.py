"""float32 GEMMs asked transposed (`transposed_gemm`): F.linear's bits from a verified row
count on, or not used at all."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from invariance_kit import assert_same_rows, invariance_prompts, mixed_requests, run_capturing
from torch import nn

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics import transposed_gemm as transposed
from astrai_batch.engine.numerics.blas_rows import PROBE_COLUMNS, RowScheme
from astrai_batch.engine.numerics.transposed_gemm import (
    MAX_ROWS,
    RACE_PAIRS,
    SWITCH_ENV_VAR,
    TransposedRoute,
    transposed_from,
    transposing_supported,
)
from astrai_batch.engine.runner import transposed_linears
from astrai_batch.engine.runner.invariant_linear import RowTiledLinear, set_row_tiling
from astrai_batch.engine.runner.transposed_linears import (
    transpose_plain_linears,
    transpose_weights,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("shape", [(576, 192, False), (1536, 576, False), (96, 160, True)])
def test_a_verified_start_gives_f_linear_bits_at_random_row_counts(shape):
    k, n, bias = shape
    start = transposed_from(k, n, bias)
    if start is None:
        pytest.skip(f"this BLAS's transposed {k} x {n} GEMM has other bits")
    seed = random.randrange(1 << 30)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator)
    b = torch.randn(n, generator=generator) if bias else None
    counts = [start, MAX_ROWS, *torch.randint(start, MAX_ROWS, (8,), generator=generator).tolist()]
    for m in counts:
        rows = torch.randn(m, k, generator=generator) * 4
        got = transposed.transposed_gemm(rows, weight, b)
        assert got.is_contiguous()
        assert torch.equal(got, F.linear(rows, weight, b)), f"seed {seed}, {m} rows"


def _exact_but_for(flip):
    """A transposed GEMM with F.linear's bits except one last bit wherever `flip(m, n)`."""

    def gemm(rows, weight, bias):
        out = F.linear(rows, weight, bias).clone()
        m, n = out.shape
        if flip(m, n):
            out[m - 1, n - 1] = out[m - 1, n - 1].view(torch.int32).add(1).view(torch.float32)
        return out

    return gemm


@pytest.mark.parametrize(
    ("flip", "start"),
    [
        (lambda m, n: False, 1),
        (lambda m, n: m < 12, 12),  # MKL's small-M kernels
        (lambda m, n: m == 33, 40),  # the check's next row count above 33
        (lambda m, n: m == 56, 63),
        (lambda m, n: m == MAX_ROWS and n > PROBE_COLUMNS, None),  # past the probe's width
    ],
)
def test_the_start_is_the_row_count_from_which_every_check_agrees(monkeypatch, flip, start):
    monkeypatch.setattr(transposed, "transposed_gemm", _exact_but_for(flip))
    assert transposed_from(64, PROBE_COLUMNS + 64, False) == start


def test_transposing_is_only_for_cpu_float32_and_can_be_switched_off(monkeypatch):
    assert transposing_supported(torch.float32, CPU)
    assert not transposing_supported(torch.bfloat16, CPU)
    assert not transposing_supported(torch.float32, torch.device("meta"))
    monkeypatch.setenv(SWITCH_ENV_VAR, "0")
    assert not transposing_supported(torch.float32, CPU)


def _timed_gemms(monkeypatch, plain_cost: float, transposed_cost: float):
    """F.linear and the transposed GEMM, each moving a fake clock on by its cost: (the clock,
    the calls made as (rows, which))."""
    now, calls = [0.0], []

    def timed(real, cost, which):
        def run(rows, weight, bias):
            now[0] += cost
            calls.append((rows.shape[0], which))
            return real(rows, weight, bias)

        return run

    monkeypatch.setattr(transposed.F, "linear", timed(F.linear, plain_cost, "F.linear"))
    monkeypatch.setattr(
        transposed, "transposed_gemm", timed(transposed.transposed_gemm, transposed_cost, "T")
    )
    return (lambda: now[0]), calls


@pytest.mark.parametrize(("cost", "kept"), [(0.90, True), (0.96, False)])
def test_each_row_class_races_both_gemms_then_keeps_the_quicker(monkeypatch, cost, kept):
    clock, calls = _timed_gemms(monkeypatch, 1.0, cost)
    route = TransposedRoute(12, clock)
    weight = torch.randn(48, 16)
    for m in (5, *[40] * (2 * RACE_PAIRS + 3), 13, MAX_ROWS + 1):
        assert route.run(torch.randn(m, 16), weight, None).shape == (m, 48)
    raced = [which for m, which in calls if m == 40]
    assert raced[: 2 * RACE_PAIRS] == ["F.linear", "T"] * RACE_PAIRS
    assert raced[2 * RACE_PAIRS :] == ["T" if kept else "F.linear"] * 3
    # below the start and above MAX_ROWS F.linear; 13 rows: a class of its own, racing
    assert [c for c in calls if c[0] != 40] == [(5, "F.linear"), (13, "F.linear"), (65, "F.linear")]
    assert route.kept() == {64: kept}


def _verified(monkeypatch, start=12):
    """Every shape verified from `start` rows; returns the shapes checked."""
    calls = []

    def verified(k, n, bias):
        calls.append((k, n, bias))
        return start

    monkeypatch.setattr(transposed_linears, "transposed_from", verified)
    return calls


def _starts(model):
    return [m._transposed.start if m._transposed is not None else None for m in model]


def test_layers_of_a_verified_shape_share_its_route_and_each_shape_is_checked_once(monkeypatch):
    calls = _verified(monkeypatch)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64), nn.Linear(64, 128))
    model.append(nn.Linear(128, 8))  # 8 columns run 64 wide (`RowTiledLinear._wide`)
    set_row_tiling(model, True, RowScheme.tiles(16))
    memo = {}
    assert transpose_weights(model, memo) == 3
    assert _starts(model) == [12, 12, 12, None]
    assert model[0]._transposed is model[2]._transposed
    assert calls == [(64, 128, True), (128, 64, True)]
    route = model[0]._transposed
    set_row_tiling(model, False)
    set_row_tiling(model, True, RowScheme.tiles(16))  # fresh layers: the routes are kept
    assert transpose_weights(model, memo) == 3 and len(calls) == 2
    assert model[0]._transposed is route
    assert "transposed from 12 rows" in repr(model[0])


def test_unverified_shapes_and_the_switch_keep_f_linear(monkeypatch):
    monkeypatch.setattr(transposed_linears, "transposed_from", lambda k, n, bias: None)
    model = nn.Sequential(nn.Linear(64, 128))
    set_row_tiling(model, True, RowScheme.tiles(16))
    assert transpose_weights(model, {}) == 0 and _starts(model) == [None]
    _verified(monkeypatch)
    monkeypatch.setenv(SWITCH_ENV_VAR, "0")
    assert transpose_weights(model, {}) == 0 and _starts(model) == [None]


def test_a_layer_runs_f_linear_outside_its_route_s_rows(monkeypatch):
    _verified(monkeypatch, start=20)
    used = []
    real = transposed.transposed_gemm
    monkeypatch.setattr(
        transposed,
        "transposed_gemm",
        lambda rows, w, b: used.append(rows.shape[0]) or real(rows, w, b),
    )
    model = nn.Sequential(nn.Linear(64, 128))
    set_row_tiling(model, True, RowScheme(12, 512, (0, *([12] * 11))))
    transpose_weights(model, {})
    with torch.inference_mode():
        for m in (5, 19, MAX_ROWS + 1, 300, 20, 20):  # 5 rows run padded to 12
            model(torch.randn(m, 64))
    assert used == [20]  # the second call of its class: the race's first transposed one


def test_fast_numerics_swap_only_the_layers_that_transpose(monkeypatch):
    _verified(monkeypatch)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 8), nn.Linear(8, 64))
    model[2] = model[2].to(torch.bfloat16)  # not float32: stays plain
    assert transpose_plain_linears(model, {}) == 1
    assert [type(m) for m in model] == [RowTiledLinear, nn.Linear, nn.Linear]
    assert model[0].scheme == RowScheme.whole() and model[0]._transposed.start == 12
    assert set_row_tiling(model, False) == 1 and type(model[0]) is nn.Linear


@pytest.mark.parametrize("numerics", ["invariant", "fast"])
def test_transposed_gemms_change_no_token(tiny_llama_dir, monkeypatch, numerics):
    """Where the BLAS verifies a shape, a float32 engine (racing both GEMMs on its steps)
    generates what it does without."""
    loaded = load_model(tiny_llama_dir, dtype="float32")
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=6)
    config = EngineConfig(page_size=8, num_pages=128, numerics=numerics)
    on, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
    tiled = [m for m in loaded.model.modules() if isinstance(m, RowTiledLinear)]
    verified = [
        m
        for m in tiled
        if m._wide is None and transposed_from(m.in_features, m.out_features, m.bias is not None)
    ]
    assert bool(verified) == any(m._transposed is not None for m in tiled)
    monkeypatch.setenv(SWITCH_ENV_VAR, "0")
    off, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
    layers = [m for m in loaded.model.modules() if isinstance(m, RowTiledLinear)]
    assert not any(m._transposed is not None for m in layers)
    assert_same_rows(off, on, range(6))
