"""Linear layers whose per-row result never depends on the other rows of the step.

A CPU GEMM picks its blocking (and with it the order in which a row's products are summed)
from the matrix sizes, among them M, the number of rows: the step's token count. The same
token then gets last-bit-different activations in a step of 7 tokens and in a step of 300,
and a sampled token near a boundary of the distribution flips. Here every projection runs
as a sequence of GEMMs of exactly `tile_rows` rows (the last tile padded with zeros), so the
kernel sees one shape whatever the step holds, and rows never interact inside a GEMM.
"""

from __future__ import annotations

import torch
from torch import nn

DEFAULT_TILE_ROWS = 128  # measured on SmolLM2: see docs/numerics.md


class RowTiledLinear(nn.Module):
    """`nn.Linear` computed in fixed-size row tiles; shares the wrapped layer's parameters."""

    def __init__(self, linear: nn.Linear, tile_rows: int) -> None:
        super().__init__()
        if tile_rows < 2:
            # one-row GEMMs go to the BLAS's matrix-vector kernel, a different reduction
            raise ValueError(f"tile_rows must be >= 2, got {tile_rows}")
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.tile_rows = tile_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        n = rows.shape[0]
        tile = self.tile_rows
        out = rows.new_empty(n, self.out_features)
        full = n - n % tile
        for start in range(0, full, tile):
            self._tile(rows[start : start + tile], out[start : start + tile])
        if full < n:  # the last rows go through a zero-padded tile of the same shape
            staged = rows.new_zeros(tile, self.in_features)
            staged[: n - full] = rows[full:]
            result = rows.new_empty(tile, self.out_features)
            self._tile(staged, result)
            out[full:] = result[: n - full]
        return out.view(*lead, self.out_features)

    def _tile(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        # inference only: the tile is written in place (out=), which autograd refuses
        weight_t = self.weight.detach().t()
        if self.bias is None:
            torch.mm(rows, weight_t, out=out)
        else:
            torch.addmm(self.bias.detach(), rows, weight_t, out=out)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, tile_rows={self.tile_rows}"


def set_row_tiling(model: nn.Module, tiled: bool, tile_rows: int = DEFAULT_TILE_ROWS) -> int:
    """Swaps every plain `nn.Linear` of `model` for a `RowTiledLinear` (or back); returns how
    many layers were swapped. A model serves one engine at a time, in either mode.

    Subclasses of nn.Linear (quantized or otherwise special layers) are left alone: their
    forward is not the plain GEMM this module reproduces.
    """
    swapped = 0
    for name, module in list(model.named_modules()):
        if not name:
            continue
        if tiled and type(module) is nn.Linear:
            model.set_submodule(name, RowTiledLinear(module, tile_rows))
        elif not tiled and isinstance(module, RowTiledLinear):
            model.set_submodule(name, _plain_linear(module))
        else:
            continue
        swapped += 1
    return swapped


def _plain_linear(tiled: RowTiledLinear) -> nn.Linear:
    linear = nn.Linear(
        tiled.in_features, tiled.out_features, bias=tiled.bias is not None, device="meta"
    )
    linear.weight = tiled.weight
    linear.bias = tiled.bias
    return linear
