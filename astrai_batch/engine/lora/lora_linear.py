"""A target linear layer with every adapter's low-rank delta beside it.

The wrapped layer (a plain `nn.Linear`, or the runner's row-tiled one: it is a submodule here,
so `set_row_tiling` swaps it as before) computes the base output of every row exactly as
without adapters; then each adapter present in the step adds `(x A^T) B^T * scaling` to its
own rows, PEFT's formula and order (base first, the scaled product added once). Base rows
are never touched, so their bits are the base model's.

Precision is PEFT's default (`autocast_adapter_dtype=True`): over a bf16 or fp16 model the
adapter's matrices are float32, the delta is computed in float32 from the rows cast to it,
scaled by alpha / r (or alpha / sqrt(r)) kept a Python float, added to the base output in
float32 and rounded once into the layer's dtype. Rounding the scale to the weight dtype (16 / 3
= 5.3333 becomes 5.3125 in bf16) or the delta before the sum would differ from PEFT.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from astrai_batch.engine.lora.step_rows import StepAdapterRows


class StepRowsSource(Protocol):
    """Where a layer reads the current step's rows by adapter (the `LoraBank`)."""

    step_rows: StepAdapterRows | None


def adapter_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype of an adapter's matrices and delta over a layer of `weight_dtype`: float32
    over half-precision layers (PEFT's autocast_adapter_dtype), else the layer's own."""
    return torch.float32 if weight_dtype in (torch.bfloat16, torch.float16) else weight_dtype


class LoraPair:
    """One adapter's matrices for one layer, on the layer's device in `adapter_dtype`, and
    its scale, a Python float (never rounded to a tensor dtype)."""

    __slots__ = ("a_t", "b_t", "scaling")

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        self.a_t = a.t()  # [in, r] view, as F.linear reads its weight
        self.b_t = b.t()  # [r, out]
        self.scaling = float(scaling)


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, bank: StepRowsSource, pairs: list[LoraPair | None]) -> None:
        super().__init__()
        self.base = base
        self.in_features = base.in_features
        self.out_features = base.out_features
        # by adapter slot (0: the base model, always None); read, never owned
        self.pairs = pairs
        object.__setattr__(self, "bank", bank)  # shared by every layer: not a submodule
        # every slot's matrices stacked, zero-padded to the largest rank (slot 0 and adapters
        # that leave this layer alone: zeros), for one batched pass over all adapters' tiles
        weight = base.weight
        self.delta_dtype = adapter_dtype(weight.dtype)
        rank = max((p.a_t.shape[1] for p in pairs if p is not None), default=1)
        a_all = weight.new_zeros(len(pairs), self.in_features, rank, dtype=self.delta_dtype)
        b_all = weight.new_zeros(len(pairs), rank, self.out_features, dtype=self.delta_dtype)
        for slot, pair in enumerate(pairs):
            if pair is not None:
                r = pair.a_t.shape[1]
                a_all[slot, :, :r] = pair.a_t
                b_all[slot, :r, :] = pair.b_t
                # the pair reads the stack from now on: the matrices are held once
                pair.a_t, pair.b_t = a_all[slot, :, :r], b_all[slot, :r, :]
        self.register_buffer("a_all", a_all, persistent=False)
        self.register_buffer("b_all", b_all, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = self.bank.step_rows
        if rows is None:
            return out
        flat_x = x.reshape(-1, self.in_features)
        flat_out = out.view(-1, self.out_features)
        if rows.tile_rows is not None:
            self._add(flat_out, rows.targets, self._tiled_delta(flat_x, rows))
            return out
        gathered = None
        for segment in rows.segments:
            pair = self.pairs[segment.slot]
            if pair is None:  # this adapter leaves this layer alone
                continue
            if gathered is None:
                gathered = flat_x.index_select(0, rows.gather).to(self.delta_dtype)
            seg_x = gathered[segment.start : segment.start + segment.padded]
            delta = low_rank(seg_x, pair, rows.tile_rows)[: segment.count] * pair.scaling
            self._add(flat_out, segment.targets, delta)
        return out

    @staticmethod
    def _add(flat_out: torch.Tensor, targets: torch.Tensor, delta: torch.Tensor) -> None:
        """flat_out[targets] += delta, the sum in the delta's dtype and rounded once into the
        output's (PEFT: `result + delta` promotes to float32, then `.to(result dtype)`). Each
        row is a target at most once."""
        if delta.dtype == flat_out.dtype:
            flat_out.index_add_(0, targets, delta)
            return
        summed = flat_out.index_select(0, targets).to(delta.dtype).add_(delta)
        flat_out.index_copy_(0, targets, summed.to(flat_out.dtype))

    def _tiled_delta(self, flat_x: torch.Tensor, rows: StepAdapterRows) -> torch.Tensor:
        """Every adapter row's `(x A^T) B^T * scaling`, as batched GEMMs over tiles of exactly
        `tile_rows` rows, each tile with its own adapter's matrices: a row's bits depend on
        neither its segment nor the step (test_lora_linear).

        One batched GEMM pair per adapter present, over its segment's tiles with the
        adapter's matrices broadcast (an expanded view: a step of many tiles, a long prefill
        chunk, copies no weights), each tile the same fixed-shape GEMM."""
        size = rows.tile_rows
        tiles = flat_x.index_select(0, rows.gather).to(self.delta_dtype)
        tiles = tiles.view(-1, size, self.in_features)
        delta = tiles.new_empty(tiles.shape[0], size, self.out_features)
        for segment in rows.segments:
            first, count = segment.start // size, segment.padded // size
            out = delta[first : first + count]
            pair = self.pairs[segment.slot]
            if pair is None:  # this adapter leaves this layer alone
                out.zero_()
                continue
            a, b = self.a_all[segment.slot], self.b_all[segment.slot]
            hidden = torch.bmm(tiles[first : first + count], a.expand(count, *a.shape))
            torch.bmm(hidden, b.expand(count, *b.shape), out=out)
            out.mul_(pair.scaling)  # a Python float: the exact scale, as PEFT
        return delta.view(-1, self.out_features).index_select(0, rows.real)

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
