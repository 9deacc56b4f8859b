"""oneDNN-packed bfloat16 weights on the CPU: the same GEMM, without repacking it per call.

torch's bfloat16 `F.linear` on the CPU hands the weight to oneDNN, whose AVX-512 BF16 and AMX
kernels read it in a blocked, pair-interleaved layout: the weight is reordered on every call.
On a decode step of 64 rows that reorder is a fifth of the GEMM (SmolLM2, 2 threads, AMD Zen
4: 576 x 1536 in 151 instead of 188 us, the 49,152-column LM head in 5.1 instead of 6.2 ms).
So the weights are packed once (`torch.ops.mkldnn._reorder_linear_weight`, what torch's own
compiler does for frozen CPU models) and each GEMM runs on the packed copy
(`torch.ops.mkldnn._linear_pointwise`).

Packing may change no bit: a shape runs packed only where `packing_matches` finds the packed
GEMM equal to `F.linear`, element for element, at every row count the row-scheme probe samples
(`blas_rows`), on that probe's adversarial data, so the invariant row schemes measured on
`F.linear` hold as they are and greedy outputs stay transformers'. The copies cost the weights'
memory once more: they are made only while they fit in a quarter of the memory the kernel
reports available. `ASTRAI_BATCH_PACKED_WEIGHTS=0` switches packing off.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from astrai_batch.engine.numerics.blas_rows import (
    DEFAULT_MAX_ROWS,
    LARGE_ROWS,
    PROBE_COLUMNS,
    SMALL_ROWS,
    adversarial_rows,
)

SWITCH_ENV_VAR = "ASTRAI_BATCH_PACKED_WEIGHTS"
FAST_ROWS = (1000, 2048)  # row counts past the invariant schemes' largest, checked as well
MEMORY_SHARE = 4  # packed copies may take at most 1 / MEMORY_SHARE of the available memory


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether this torch packs `dtype` weights on `device`: bfloat16 on a CPU with oneDNN."""
    if os.environ.get(SWITCH_ENV_VAR, "1").strip() == "0":
        return False
    if device.type != "cpu" or dtype != torch.bfloat16:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    # oneDNN packs bfloat16 only for CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT and
    # raises elsewhere (seen on an AMD Zen 3: AVX2 only), where `--dtype bfloat16` runs
    # F.linear unpacked
    try:
        pack(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's layout for any row count (an opaque tensor)."""
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_gemm(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    """`F.linear(rows, weight, bias)` over the packed weight; rows 2-D."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


def packing_matches(k: int, n: int, bias: bool, max_rows: int = DEFAULT_MAX_ROWS) -> bool:
    """Whether the packed GEMM gives `F.linear`'s bits for a bfloat16 K x N weight: every row
    count up to `SMALL_ROWS`, the probe's large ones and `FAST_ROWS` on `PROBE_COLUMNS`
    columns, a few at the full width."""
    generator = torch.Generator().manual_seed(33)
    weight = adversarial_weight(n, k, generator)
    b = torch.randn(n, generator=generator).to(torch.bfloat16) if bias else None
    narrow = min(n, PROBE_COLUMNS)
    runs = [(m, narrow) for m in checked_row_counts(max_rows)]
    if n > narrow:
        runs += [(m, n) for m in (1, 7, 64, max_rows)]
    packs = {width: pack(weight[:width]) for width in {narrow, n}}
    with torch.inference_mode():
        for m, width in runs:
            rows = adversarial_rows(m, k, generator).to(torch.bfloat16)
            w, bw = weight[:width], None if b is None else b[:width]
            if not torch.equal(packed_gemm(rows, packs[width], bw), F.linear(rows, w, bw)):
                return False
    return True


def checked_row_counts(max_rows: int = DEFAULT_MAX_ROWS) -> list[int]:
    """The row counts a packed GEMM must match `F.linear` at: every one up to `SMALL_ROWS`,
    the row probe's large ones, its largest, and (fast numerics runs whole prefill chunks in
    one GEMM) `FAST_ROWS`."""
    return sorted({*range(1, SMALL_ROWS + 1), *LARGE_ROWS, max_rows, *FAST_ROWS})


def adversarial_weight(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """A bfloat16 [n, k] weight for `blas_rows.adversarial_rows`: every 8th column 64, so
    large products cancel and the small ones' summation order shows."""
    weight = torch.randn(n, k, generator=generator)
    weight[:, ::8] = 64.0
    return weight.to(torch.bfloat16)


def memory_allows(nbytes: int, meminfo: Path = Path("/proc/meminfo")) -> bool:
    """Whether `nbytes` of packed copies fit the share of available memory they may take
    (False where the kernel does not say what is available)."""
    try:
        lines = meminfo.read_text(encoding="ascii").splitlines()
    except OSError:
        return False
    for line in lines:
        if line.startswith("MemAvailable:"):
            return nbytes * MEMORY_SHARE <= int(line.split()[1]) * 1024
    return False
