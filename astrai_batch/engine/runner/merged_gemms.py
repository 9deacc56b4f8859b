"""Projections of one input run as one packed GEMM (a layer's q, k and v; its gate and up), on
the CPU in bfloat16, with the bits of the separate layers.

At a decode step's 64 rows a GEMM's fixed cost is a large part of it: SmolLM2's q, k and v
take 165 us as three packed GEMMs and 118 us as one of 960 columns, gate and up 298 and 280 us
(2 threads, Zen 5). oneDNN computes each output column over K in the same order whatever N
is, but that is its choice, not a promise: so a merge is used only where `merged_matches`
finds the merged GEMM's columns equal to each layer's `F.linear`, bit for bit, at every row
count the packing check samples, on its adversarial rows (the evidence `packed_gemm` asks for
packing itself), and on the layers' own row scheme: a step of more rows than one GEMM takes
runs as the same GEMMs of its rows the layers would run (`invariant_linear.by_scheme`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from astrai_batch.engine.numerics.blas_rows import RowScheme, adversarial_rows
from astrai_batch.engine.numerics.packed_gemm import (
    adversarial_weight,
    checked_row_counts,
    memory_allows,
    pack,
    packed_gemm,
)
from astrai_batch.engine.runner.invariant_linear import RowTiledLinear, by_scheme


@dataclass(frozen=True, eq=False)
class MergedGemm:
    """The layers' weights side by side, packed; `run` gives each layer's output."""

    layers: tuple[nn.Module, ...]  # the layers merged, checked by identity at each call
    packed: torch.Tensor
    bias: torch.Tensor | None
    sizes: tuple[int, ...]  # each layer's output columns, in order
    scheme: RowScheme  # the layers' row scheme, which the merged GEMMs follow

    def applies(self, layers: tuple[nn.Module, ...]) -> bool:
        """Whether a step through `layers` may run merged: they are the layers merged."""
        return all(a is b for a, b in zip(layers, self.layers, strict=True))

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The layers' outputs side by side, [n, sum(sizes)], for contiguous `rows` [n, K]."""
        return by_scheme(rows, self.scheme, self._gemm, sum(self.sizes))

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        return packed_gemm(rows, self.packed, self.bias)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each layer's output for `x` [..., K]: column slices of one [rows, N] result."""
        rows = x.reshape(-1, x.shape[-1])
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = self.rows(rows)
        lead = x.shape[:-1]
        return tuple(part.view(*lead, part.shape[-1]) for part in out.split(self.sizes, dim=1))


def merged_gemm(layers: tuple[nn.Module, ...], memo: dict) -> MergedGemm | None:
    """The merge of `layers` (the same input), or None: each a packed `RowTiledLinear` on one
    row scheme, biases all or none, the merged GEMM verified and its copy fitting in memory.
    Verdicts and copies live in `memo` (the loaded model's probe results)."""
    if not all(type(m) is RowTiledLinear and m._packed is not None for m in layers):
        return None
    scheme = layers[0].scheme
    k = layers[0].in_features
    biased = {m.bias is not None for m in layers}
    if len(biased) != 1 or any(m.scheme != scheme or m.in_features != k for m in layers):
        return None
    sizes = tuple(m.out_features for m in layers)
    has_bias = biased.pop()
    verdict = ("merged gemm", k, sizes, has_bias, torch.get_num_threads())
    if verdict not in memo:
        memo[verdict] = merged_matches(k, sizes, has_bias)
    if not memo[verdict]:
        return None
    copies = memo.setdefault(("merged weights",), {})
    weights = tuple(m.weight for m in layers)
    key = tuple(id(w) for w in weights)
    entry = copies.get(key)
    if entry is None or any(a is not b for a, b in zip(entry[0], weights, strict=True)):
        if not memory_allows(sum(w.nbytes for w in weights)):
            return None
        with torch.inference_mode():
            merged = torch.cat([w.detach() for w in weights])
            bias = torch.cat([m.bias.detach() for m in layers]) if has_bias else None
        entry = copies[key] = (weights, pack(merged), bias)
    return MergedGemm(layers, entry[1], entry[2], sizes, scheme)


def merged_matches(k: int, sizes: tuple[int, ...], bias: bool) -> bool:
    """Whether one packed GEMM over weights of `sizes` output columns side by side gives each
    weight's `F.linear` bits, at every row count packing is checked at."""
    generator = torch.Generator().manual_seed(35)
    weights = [adversarial_weight(n, k, generator) for n in sizes]
    biases = [torch.randn(n, generator=generator).to(torch.bfloat16) for n in sizes]
    merged = pack(torch.cat(weights))
    merged_bias = torch.cat(biases) if bias else None
    with torch.inference_mode():
        for m in checked_row_counts():
            rows = adversarial_rows(m, k, generator).to(torch.bfloat16)
            parts = packed_gemm(rows, merged, merged_bias).split(sizes, dim=1)
            for part, weight, b in zip(parts, weights, biases, strict=True):
                if not torch.equal(part, F.linear(rows, weight, b if bias else None)):
                    return False
    return True
