"""A target linear layer with every adapter's low-rank delta beside it.

The wrapped layer (a plain `nn.Linear`, or the runner's row-tiled one: it is a submodule here,
so `set_row_tiling` swaps it as before) computes the base output of every row exactly as
without adapters; then each adapter present in the step adds `(x A^T) B^T * scaling` to its
own rows, PEFT's formula and order (base first, the scaled product added once). Base rows
are never touched, so their bits are the base model's.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from astrai_batch.engine.lora.step_rows import StepAdapterRows


class StepRowsSource(Protocol):
    """Where a layer reads the current step's rows by adapter (the `LoraBank`)."""

    step_rows: StepAdapterRows | None


class LoraPair:
    """One adapter's matrices for one layer, on the layer's device and dtype."""

    __slots__ = ("a_t", "b_t", "scaling")

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        self.a_t = a.t()  # [in, r] view, as F.linear reads its weight
        self.b_t = b.t()  # [r, out]
        self.scaling = scaling


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, bank: StepRowsSource, pairs: list[LoraPair | None]) -> None:
        super().__init__()
        self.base = base
        self.in_features = base.in_features
        self.out_features = base.out_features
        # by adapter slot (0: the base model, always None); read, never owned
        self.pairs = pairs
        object.__setattr__(self, "bank", bank)  # shared by every layer: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = self.bank.step_rows
        if rows is None:
            return out
        flat_x = x.reshape(-1, self.in_features)
        flat_out = out.view(-1, self.out_features)
        gathered = None
        for segment in rows.segments:
            pair = self.pairs[segment.slot]
            if pair is None:  # this adapter leaves this layer alone
                continue
            if gathered is None:
                gathered = flat_x.index_select(0, rows.gather)
            seg_x = gathered[segment.start : segment.start + segment.padded]
            delta = low_rank(seg_x, pair, rows.tile_rows)[: segment.count] * pair.scaling
            flat_out.index_add_(0, segment.targets, delta)
        return out

    def extra_repr(self) -> str:
        return f"adapters={sum(p is not None for p in self.pairs)}"


def low_rank(x: torch.Tensor, pair: LoraPair, tile_rows: int | None) -> torch.Tensor:
    """(x A^T) B^T; with `tile_rows`, as GEMMs of exactly that many rows (x is whole tiles), so
    a row's bits depend on neither the segment's size nor the step's."""
    if tile_rows is None:
        return torch.mm(torch.mm(x, pair.a_t), pair.b_t)
    # one batched GEMM of [tiles, tile_rows, in] per matrix: every batch entry has the same
    # shape whatever the tile count (test_lora_linear checks the bits over random steps)
    tiles = x.view(-1, tile_rows, x.shape[1])
    hidden = torch.matmul(tiles, pair.a_t)
    return torch.matmul(hidden, pair.b_t).view(x.shape[0], -1)
