"""The kernels under batch invariance: a row's result never depends on the other rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai_batch.engine.attention.block_plan import block_tokens_for
from astrai_batch.engine.numerics.blas_rows import (
    RowScheme,
    attention_row_scheme,
    pad_gemm_rows,
    probe_row_scheme,
    probe_row_schemes,
)
from astrai_batch.engine.runner.invariant_linear import (
    RowTiledLinear,
    row_scheme_for,
    row_schemes_for,
    set_row_tiling,
)
from astrai_batch.errors import NumericsUnavailableError


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scheme", ["tiles of 8", "probed"])
def test_tiled_linear_row_ignores_count_position_and_neighbours(bias, scheme):
    """Covers the scheme the engine runs (probed on this machine's BLAS, at these shapes)
    and fixed tiles; 600 rows pass the probed scheme's one-GEMM limit of 512."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    if scheme == "probed":
        tiled = RowTiledLinear(linear, row_scheme_for(nn.Sequential(linear)))
        counts = (*range(1, 20), 31, 64, 200, 511, 512, 513, 600)
    else:
        tiled = RowTiledLinear(linear, 8)
        counts = (1, 2, 7, 8, 9, 17, 64)
    row = torch.randn(96)
    results = []
    with torch.inference_mode():
        for count in counts:
            for position in {0, count // 2, count - 1}:
                batch = torch.randn(1, count, 96) * 10
                batch[0, position] = row
                results.append(tiled(batch)[0, position])
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], linear(row), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_features", [1, 3])
def test_a_narrow_output_fed_to_a_sigmoid_ignores_the_row_count(out_features):
    """Qwen2-MoE's shared-expert gate: a 1-column output under a sigmoid. Contiguous, the
    sigmoid's last elements ran in a scalar loop with other bits; the tiled layer hands on a
    strided view of a 64-wide GEMM, so the sigmoid of a row is the same at any count."""
    torch.manual_seed(0)
    linear = nn.Linear(64, out_features, bias=False)
    tiled = RowTiledLinear(linear, row_scheme_for(nn.Sequential(linear)))
    x = torch.randn(300, 64) * 3
    with torch.inference_mode():
        whole = torch.sigmoid(tiled(x))
        for start, stop in ((0, 1), (3, 10), (17, 50), (100, 297), (299, 300)):
            assert torch.equal(torch.sigmoid(tiled(x[start:stop])), whole[start:stop])
        torch.testing.assert_close(whole, torch.sigmoid(linear(x)), rtol=1e-5, atol=1e-6)


def test_row_tiling_swaps_plain_linears_and_back():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))
    weight = model[0].weight
    assert set_row_tiling(model, True, tile_rows=4) == 2
    assert isinstance(model[0], RowTiledLinear) and isinstance(model[2][0], RowTiledLinear)
    assert model[0].weight is weight
    assert set_row_tiling(model, True, tile_rows=4) == 0  # already tiled
    assert set_row_tiling(model, False) == 2
    assert type(model[0]) is nn.Linear and model[0].weight is weight


def test_tile_rows_below_two_is_refused():
    with pytest.raises(ValueError, match="tile_rows must be >= 2, got 1"):
        RowTiledLinear(nn.Linear(2, 2), 1)


@pytest.mark.parametrize(("k", "n"), [(64, 64), (64, 128), (128, 64), (32, 64), (64, 32)])
def test_blas_rows_do_not_depend_on_row_count(k, n):
    """What the block attention relies on: for a reduction over one head (k = head_dim) or
    one key block (k = block), a GEMM row's result is the same for any row count once small
    counts are padded as the probed scheme says (on MKL / AMD Zen 4 a 2- or 3-row GEMM's
    rows differ from the same rows in a larger one, so padding to 2 rows is not enough). If
    a BLAS breaks this, batch invariance breaks with it, and this test says so first."""
    torch.manual_seed(1)
    scheme = attention_row_scheme(k, n, n, 1024, torch.device("cpu"), torch.float32)
    b = torch.randn(k, n)
    a = torch.randn(1024, k)
    first = (a @ b)[0]
    for m in (1, 2, 3, 5, 6, 9, 11, 48, 64, 200, 1024):
        assert torch.equal((pad_gemm_rows(a[:m], scheme) @ b)[0], first), f"{m} rows"
    batched = torch.matmul(pad_gemm_rows(a[:6].view(2, 3, k), scheme), b.expand(2, k, n))
    assert torch.equal(batched[0, 0], first)


def test_block_is_whole_pages_of_at_least_64_tokens():
    assert block_tokens_for(16) == 64
    assert block_tokens_for(8) == 64
    assert block_tokens_for(24) == 72
    assert block_tokens_for(128) == 128


def split_k_at(rule):
    """A real GEMM whose reduction order depends on M: the K products are summed in two
    parts cut at `rule(M)`, so rows of two row counts with different cuts differ in bits."""

    def gemm(a, weight, bias):
        cut = rule(a.shape[0])
        out = a[:, :cut] @ weight[:, :cut].t() + a[:, cut:] @ weight[:, cut:].t()
        return out if bias is None else out + bias

    return gemm


def test_probe_pads_small_counts_when_only_large_ones_are_invariant():
    scheme = probe_row_scheme([(64, 32, False)], max_rows=40, gemm=split_k_at(lambda m: min(m, 12)))
    assert scheme == RowScheme(min_rows=12, max_rows=40, pad_to=(0, *[12] * 11))


def test_probe_falls_back_to_tiles_when_large_counts_are_not_invariant():
    # the reference (48 rows) cuts at 1, as every multiple of 8 does: GEMMs of 40 rows, the
    # last one padded to the next multiple of 8
    scheme = probe_row_scheme([(64, 32, True)], max_rows=40, gemm=split_k_at(lambda m: 1 + m % 8))
    pad_to = [0] + [8 * -(-m // 8) for m in range(1, 40)]
    assert scheme == RowScheme(min_rows=40, max_rows=40, pad_to=tuple(pad_to))


def test_probe_refuses_invariant_numerics_when_no_row_count_is_invariant():
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 64))
    with pytest.raises(NumericsUnavailableError) as caught:
        row_scheme_for(model, max_rows=16, gemm=split_k_at(lambda m: m))
    assert str(caught.value) == (
        f"batch-invariant numerics are unavailable here: torch {torch.__version__}'s BLAS "
        "gives no GEMM row count whose rows are independent of it (K x N 32 x 64); "
        "run with --fast-numerics"
    )


def test_probe_on_this_machine_finds_a_scheme_for_the_model_shapes():
    """SmolLM2-135M's projections and the tiny models' (both with and without bias)."""
    shapes = [(576, 576, False), (576, 192, False), (576, 1536, False), (1536, 576, False)]
    shapes += [(576, 49152, False), (64, 64, True), (64, 32, True), (64, 128, False)]
    scheme = probe_row_scheme(shapes)
    assert scheme.max_rows == 512
    # Where small steps pad to depends on the BLAS: 16 rows on the AMD EPYCs measured so far,
    # 255 on a Sapphire Rapids Xeon's MKL (docs/numerics-cost.md); always below the largest
    # GEMM, and every small step pads to a size the probe found invariant.
    assert scheme.min_rows < scheme.max_rows, scheme.describe()
    assert all(m <= pad <= scheme.min_rows for m, pad in enumerate(scheme.pad_to) if m), (
        scheme.describe()
    )


def test_reduced_precision_runs_one_gemm_where_every_large_count_keeps_a_rows_bits():
    """bfloat16 on a kernel whose cut is the same from 7 rows on (oneDNN's AVX-512 BF16 on
    AMD Zen 4 is like that from 2): small steps pad to 7, one GEMM up to 512 rows; a wide
    output is checked at its full width too."""
    gemm = split_k_at(lambda m: 7 if m >= 8 else m)
    shapes = [(64, 32, False), (64, 48, True), (64, 1000, False)]
    schemes = probe_row_schemes(shapes, gemm=gemm, dtype=torch.bfloat16)
    want = RowScheme(min_rows=7, max_rows=512, pad_to=(0, *[7] * 6))
    assert set(schemes.values()) == {want}
    assert want.describe() == "M < 7 padded to [7], one GEMM up to 512 rows"

    def late_columns_differ(a, weight, bias):  # past 768 columns, large M cut elsewhere
        out = gemm(a, weight, bias)
        if a.shape[0] > 100:
            out[:, 768:] = split_k_at(lambda m: 3)(a, weight[768:], None)
        return out

    (wide,) = probe_row_schemes(
        [(64, 1000, False)], gemm=late_columns_differ, dtype=torch.bfloat16
    ).values()
    assert (wide.min_rows, wide.max_rows) == (64, 64)


def test_reduced_precision_runs_fixed_tiles_padding_to_smaller_ones_that_agree():
    """bfloat16 where large counts sum otherwise than a tile's: every GEMM one tile; a
    remainder pads to the smallest probed size whose rows equal the tile's (here the cut is
    the same from 8 to 64 rows)."""
    gemm = split_k_at(lambda m: m if m < 8 else 7 if m <= 64 else 3)
    schemes = probe_row_schemes([(64, 32, False), (64, 48, True)], gemm=gemm, dtype=torch.bfloat16)
    pad_to = (0, *[8] * 8, *[16] * 8, *[32] * 16, *[64] * 31)
    assert set(schemes.values()) == {RowScheme(min_rows=64, max_rows=64, pad_to=pad_to)}
    # float32 keeps one scheme for every shape (MKL's rows: `probe_row_scheme`)
    one = probe_row_schemes([(64, 32, False), (64, 48, True)], gemm=gemm)
    assert len(set(one.values())) == 1


def test_reduced_precision_refuses_where_a_row_depends_on_its_place_in_the_tile():
    def by_place(a, weight, bias):  # odd rows summed in another order than even ones
        out = split_k_at(lambda m: 5)(a, weight, bias)
        out[1::2] = split_k_at(lambda m: 9)(a[1::2], weight, bias)
        return out

    with pytest.raises(NumericsUnavailableError) as caught:
        probe_row_schemes([(64, 32, False)], gemm=by_place, dtype=torch.bfloat16)
    assert str(caught.value) == (
        f"batch-invariant numerics are unavailable here: torch {torch.__version__}'s bfloat16 "
        "GEMM gives no tile of 64, 128, 32, 16 rows whose rows are independent of their place "
        "in it (K x N 64 x 32); run with --fast-numerics"
    )


@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_tiled_linear_row_ignores_count_position_and_neighbours(bias):
    """This machine's bfloat16 GEMM (oneDNN; AMX where the CPU has it, emulated where not),
    on the probed tiles: a row's bits are the same at any count and place."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias).to(torch.bfloat16)
    tiled = RowTiledLinear(linear, row_schemes_for(nn.Sequential(linear))[(96, 80, bias)])
    row = torch.randn(96).to(torch.bfloat16)
    results = []
    with torch.inference_mode():
        for count in (1, 2, 7, 33, 64, 65, 130, 300):
            for position in {0, count // 2, count - 1}:
                batch = (torch.randn(1, count, 96) * 10).to(torch.bfloat16)
                batch[0, position] = row
                results.append(tiled(batch)[0, position])
    assert all(torch.equal(r, results[0]) for r in results)
