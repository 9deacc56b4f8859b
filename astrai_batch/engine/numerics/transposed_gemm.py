"""float32 GEMMs of decode-sized steps on the CPU asked the other way round, where the BLAS
then gives F.linear's bits faster.

torch's float32 `F.linear(x, W)` asks MKL for `x Wᵀ`: M rows of the step, N = the layer's
outputs. Asked as `W xᵀ` (N rows, the step's M as columns) and transposed back, the same
product took 0.86x the time at a decode step's 64 rows for SmolLM2's gate/up and down
projections on an AMD Zen 3 (MKL 2024.0, 2 threads; in a job, the two alternating call by
call) and 0.74-0.81x for its 49,152-column LM head. Each output is the same dot product over
K, and there MKL sums it in the same order both ways from 12 rows on (and at 1); at 2-11
rows `F.linear` takes MKL's small-M kernels, whose order differs. Above 64 rows (prefill
chunks) the saving was 0.88-0.95x, not worth the checks at those sizes.

That is MKL's behaviour on that CPU, not a promise. So a shape runs transposed only from the
row count `transposed_from` finds up to `MAX_ROWS`: the smallest from which the transposed
GEMM equals `F.linear`, element for element, at every row count of `CHECKED_ROWS` on
adversarial data (the probe's width, and the full width at 64 rows); other steps keep
`F.linear`. The invariant row schemes, measured on `F.linear`, hold as they are, and greedy
outputs stay transformers'. Whether it is faster here is found on the job's own steps
(`TransposedRoute`): its first calls alternate between the two, timed, and each row-count
class then keeps the quicker. Which of two GEMMs with the same bits runs changes no output,
only the time, so that choice cannot break invariance. `ASTRAI_BATCH_TRANSPOSED_GEMMS=0`
switches it off.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from astrai_batch.engine.numerics.blas_rows import PROBE_COLUMNS, adversarial_rows

SWITCH_ENV_VAR = "ASTRAI_BATCH_TRANSPOSED_GEMMS"
MAX_ROWS = 64  # decode steps; larger steps keep F.linear
CHECKED_ROWS = (*range(1, 33), 33, 40, 48, 56, 63, MAX_ROWS)
FULL_WIDTH_ROWS = (MAX_ROWS,)  # checked at the layer's whole width too
RACE_PAIRS = 8  # calls of each GEMM, alternating, before a row-count class keeps one
FASTER_BY = 0.95  # the transposed GEMM is kept where it took at most this share of F.linear


def transposing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a `dtype` weight on `device` may run transposed: float32 on the CPU."""
    if os.environ.get(SWITCH_ENV_VAR, "1").strip() == "0":
        return False
    return device.type == "cpu" and dtype == torch.float32


def transposed_gemm(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """`F.linear(rows, weight, bias)` computed as `weight rowsᵀ` (bias added as the BLAS adds
    it, per output row); rows 2-D, the result contiguous."""
    if bias is None:
        out = torch.mm(weight, rows.t())
    else:
        out = torch.addmm(bias.unsqueeze(1), weight, rows.t())
    return out.t().contiguous()


def transposed_from(k: int, n: int, bias: bool) -> int | None:
    """The smallest row count from which the transposed GEMM gives `F.linear`'s bits for a
    float32 K x N weight at every row count of `CHECKED_ROWS` (the probe's width; the full
    width at `FULL_WIDTH_ROWS` as well), or None where it does not at `MAX_ROWS`."""
    generator = torch.Generator().manual_seed(34)
    narrow = min(n, PROBE_COLUMNS)
    weight = torch.randn(narrow, k, generator=generator)
    weight[:, ::8] = 64.0  # against adversarial_rows' +-64 columns: products that cancel
    # the probe's rows repeated to the full width (random numbers for an LM head's 28M
    # weights took longer than the checks): each output is its own dot product all the same
    weight = weight.repeat(-(-n // narrow), 1)[:n]
    b = torch.randn(n, generator=generator) if bias else None
    start = None
    with torch.inference_mode():
        for m in sorted(CHECKED_ROWS, reverse=True):
            rows = adversarial_rows(m, k, generator)
            widths = (narrow, n) if m in FULL_WIDTH_ROWS and n > narrow else (narrow,)
            for width in widths:
                w, bw = weight[:width], None if b is None else b[:width]
                if not torch.equal(transposed_gemm(rows, w, bw), F.linear(rows, w, bw)):
                    return start
            start = m
    return start


class TransposedRoute:
    """How one verified shape runs a step of M rows: `F.linear` below `start` and above
    `MAX_ROWS`; in between, in each class of M (powers of two), the first `RACE_PAIRS` calls
    of each GEMM alternate, timed (the layers of that shape in one step: the same M, the
    same moment), and then the class keeps the transposed GEMM if it took at most `FASTER_BY`
    of F.linear's time. Shared by the shape's layers; one engine step at a time."""

    def __init__(self, start: int, clock=time.perf_counter) -> None:
        self.start = start
        self._clock = clock
        self._totals: dict[int, list[float]] = {}  # class -> [F.linear s, transposed s, calls each]
        self._kept: dict[int, bool] = {}  # class -> the transposed GEMM kept

    def run(self, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        m = rows.shape[0]
        if not self.start <= m <= MAX_ROWS:
            return F.linear(rows, weight, bias)
        group = (m - 1).bit_length()
        kept = self._kept.get(group)
        if kept is not None:
            return transposed_gemm(rows, weight, bias) if kept else F.linear(rows, weight, bias)
        totals = self._totals.setdefault(group, [0.0, 0.0, 0, 0])
        transposed = totals[3] < totals[2]  # the one with fewer calls so far
        began = self._clock()
        out = transposed_gemm(rows, weight, bias) if transposed else F.linear(rows, weight, bias)
        totals[transposed] += self._clock() - began
        totals[2 + transposed] += 1
        if totals[3] >= RACE_PAIRS:
            self._kept[group] = totals[1] <= FASTER_BY * totals[0]
        return out

    def kept(self) -> dict[int, bool]:
        """The classes decided so far: the largest M of each -> whether it runs transposed."""
        return {1 << group: kept for group, kept in sorted(self._kept.items())}
