"""The kernels under batch invariance: a row's result never depends on the other rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai_batch.engine.attention.block_attention import MIN_GEMM_ROWS, pad_gemm_rows
from astrai_batch.engine.attention.block_plan import block_tokens_for
from astrai_batch.engine.runner.invariant_linear import RowTiledLinear, set_row_tiling


@pytest.mark.parametrize("bias", [False, True])
def test_tiled_linear_row_ignores_count_position_and_neighbours(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    tiled = RowTiledLinear(linear, tile_rows=8)
    row = torch.randn(96)
    results = []
    with torch.inference_mode():
        for count in (1, 2, 7, 8, 9, 17, 64):
            for position in {0, count // 2, count - 1}:
                batch = torch.randn(1, count, 96) * 10
                batch[0, position] = row
                results.append(tiled(batch)[0, position])
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], linear(row), rtol=1e-5, atol=1e-5)


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
        RowTiledLinear(nn.Linear(2, 2), tile_rows=1)


@pytest.mark.parametrize(("k", "n"), [(64, 64), (64, 128), (128, 64), (32, 64), (64, 32), (16, 64)])
def test_blas_rows_do_not_depend_on_row_count(k, n):
    """What the block attention relies on: for a reduction over one head (k = head_dim) or
    one key block (k = block), a GEMM row's result is the same for any row count >=
    MIN_GEMM_ROWS (x86 BLAS sums 2- and 3-row GEMMs otherwise). If a BLAS breaks this, batch
    invariance breaks with it, and this test says so first."""
    torch.manual_seed(1)
    b = torch.randn(k, n)
    a = torch.randn(1024, k)
    least = MIN_GEMM_ROWS
    first = (a[:least] @ b)[0]
    for m in (least + 1, 2 * least + 3, 48, 64, 200, 1024):
        assert torch.equal((a[:m] @ b)[0], first), f"row 0 differs with {m} rows"
    batched = torch.matmul(a[: 2 * least].view(2, least, k), b.expand(2, k, n))[0, 0]
    assert torch.equal(batched, first)


def test_small_gemms_are_padded_to_the_least_row_count():
    x = torch.randn(3, 2, 5)
    padded = pad_gemm_rows(x)
    assert padded.shape == (3, MIN_GEMM_ROWS, 5)
    assert torch.equal(padded[:, :2], x) and not padded[:, 2:].any()
    wide = torch.randn(MIN_GEMM_ROWS, 5)
    assert pad_gemm_rows(wide) is wide


def test_block_is_whole_pages_of_at_least_64_tokens():
    assert block_tokens_for(16) == 64
    assert block_tokens_for(8) == 64
    assert block_tokens_for(24) == 72
    assert block_tokens_for(128) == 128
