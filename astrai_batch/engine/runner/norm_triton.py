"""The mean of squares of each row, one Triton program per row: RMSNorm's only reduction,
in an order fixed by construction (`invariant_norms`).

torch's CUDA reduction chooses how a row's sum is split over threads and blocks from the
tensor's shape, the number of rows among it, so the same token's norm could differ in a step
of 3 tokens and of 300. Here a program sums one row with a block of a compile-time width;
the row count only sets how many programs run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_WIDTH = 16384  # one program holds a whole row; wider rows use row tiles instead


@triton.jit
def _mean_squares_kernel(x_ptr, out_ptr, stride, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < WIDTH, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(x * x, 0) / WIDTH)


def mean_squares(x: torch.Tensor) -> torch.Tensor:
    """x [..., W] -> [..., 1] float32: each row's mean of squares."""
    width = x.shape[-1]
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], device=x.device, dtype=torch.float32)
    if rows.shape[0]:
        block = triton.next_power_of_2(width)
        _mean_squares_kernel[(rows.shape[0],)](
            rows,
            out,
            rows.stride(0),
            WIDTH=width,
            BLOCK=block,
            num_warps=8 if block > 4096 else 4,
            enable_fp_fusion=False,  # as `invariant_triton`: one rounding per operation
        )
    return out.view(*x.shape[:-1], 1)
