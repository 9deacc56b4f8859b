"""Whether torch's CPU flash kernel keeps the rules `flash_block_plan` relies on, here, and
for which key block.

Measured on AMD Zen 4/5 and an Intel Sapphire Rapids Xeon with torch 2.13's MKL: a query
row's output differs from the same row in another call only when it sits in a last query
block of 1-3 rows; calls of any row count that is a multiple of 4 (query blocks of 32, 64 or
256 rows) and any batch give every row the same bits; for 512-key blocks, a last block of
64, 128, 192, 384 or 448 keys gives the full block's bits, one of 256 or 320 does not (the
BLAS sums those P x V GEMMs' keys in other chunks).
Another CPU, BLAS or torch may differ, so the engine asks this probe before it plans calls
that way, with the model's head size, KV heads and dtype: `probe_flash_block` judges each
block length of `block_candidates(dtype)` in order of preference (128 keys first: a shorter
block shares a shorter prefix, a longer one costs fewer kernel elements; `flash_block_types`),
and the plan keys its calls by the first that keeps every rule. The choice depends on the
model's shapes, the dtype and the machine, never on a step. Where no block keeps them, the
engine keeps the block attention. A few dozen kernel calls per block (SmolLM2's shapes:
about 0.1 s each).
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.flash_block_types import (
    KERNEL_BLOCK,
    ROW_MULTIPLE,
    TAIL_STEP,
    block_candidates,
)
from astrai_batch.engine.attention.flash_blocks import flash_kernel

# call row counts: every query-block size (32, 64, 256) with remainders 0 and 4, and small
PROBE_ROWS = (4, 8, 12, 16, 32, 36, 60, 64, 68, 188, 192, 196, 252, 256, 260, 764, 768, 772)
REFERENCE_ROWS = 1040  # 4 x 256 + 16: the 256-row split, its own remainder a multiple of 4
PROBE_SEED = 25


def probe_flash_block(
    head_dim: int, kv_heads: int, dtype: torch.dtype, page_size: int
) -> tuple[int, tuple[int, ...]] | None:
    """The first candidate block of whole pages (`block_candidates`, preferred first; below
    float32 only the kernel's 512) whose every rule holds here, with its tails; None where
    none does."""
    for block in block_candidates(dtype):
        if block % page_size:  # a query's blocks are whole pages
            continue
        tails = invariant_tails(head_dim, kv_heads, dtype, block)
        if tails is not None:
            return block, tails
    return None


def invariant_tails(
    head_dim: int, kv_heads: int, dtype: torch.dtype, block: int = KERNEL_BLOCK
) -> tuple[int, ...] | None:
    """The last-block key lengths whose rows get a full `block`'s bits, ascending (`block`
    among them), when every probed row count and shape of a call over one block does too and
    the exponential ignores an element's position; else None."""
    if ROW_MULTIPLE != 4 or block > KERNEL_BLOCK or block % TAIL_STEP:
        raise AssertionError("the probe's row counts assume ROW_MULTIPLE 4, blocks of 64..512")
    generator = torch.Generator().manual_seed(PROBE_SEED + block)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    # one block's keys: every call the plan makes reads at most one (its key start shifted)
    q = randn(1, kv_heads, REFERENCE_ROWS, head_dim)
    k = randn(1, kv_heads, block, head_dim)
    v = randn(1, kv_heads, block, head_dim)
    # each group of 4 rows shares a query position: 4 rows are also one decode's folded rows
    positions = torch.randint(0, block, (REFERENCE_ROWS // 4,), generator=generator)
    positions = positions.repeat_interleave(4)
    mask = torch.zeros(REFERENCE_ROWS, block, dtype=dtype)
    mask.masked_fill_(torch.arange(block)[None, :] > positions[:, None], float("-inf"))
    kernel = flash_kernel()
    with torch.inference_mode():
        reference = kernel(q, k, v, attn_mask=mask[None, None], scale=0.125)[0][0]

        def same(rows, out: torch.Tensor) -> bool:
            return torch.equal(out, reference[:, rows])

        for m in PROBE_ROWS:  # a prefill chunk's shape: one element, m rows
            for first in {0, REFERENCE_ROWS - m}:
                rows = slice(first, first + m)
                out = kernel(q[:, :, rows], k, v, attn_mask=mask[None, None, rows], scale=0.125)
                if not same(rows, out[0][0]):
                    return None
        # rows ending in the block's first half, the masked keys' contents changed: they
        # must not count
        rows = (positions < block // 2).nonzero().flatten()[:64]
        rows = rows[: len(rows) // ROW_MULTIPLE * ROW_MULTIPLE]
        k1, v1 = k.clone(), v.clone()
        last = int(positions[rows].max()) if len(rows) else block - 1
        k1[:, :, last + 1 :] = randn(1, kv_heads, block - last - 1, head_dim)
        v1[:, :, last + 1 :] = randn(1, kv_heads, block - last - 1, head_dim)
        short = mask[None, None, rows]
        if not same(rows, kernel(q[:, :, rows], k1, v1, attn_mask=short, scale=0.125)[0][0]):
            return None
        # decodes' shape: elements of 4 rows, each its own mask row broadcast over its rows
        for first in (0, REFERENCE_ROWS - 12, REFERENCE_ROWS // 2 - 8):
            qs = q[0, :, first : first + 12].reshape(kv_heads, 3, 4, head_dim).transpose(0, 1)
            ms = mask[first : first + 12 : 4].view(3, 1, 1, block)
            kk, vv = k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1)
            out = kernel(qs.contiguous(), kk, vv, attn_mask=ms, scale=0.125)[0]
            if not same(slice(first, first + 12), out.transpose(0, 1).reshape(kv_heads, 12, -1)):
                return None
        # a last block shorter than the block: the rows whose keys it holds
        tails = []
        for tail in range(TAIL_STEP, block + 1, TAIL_STEP):
            rows = (positions < tail).nonzero().flatten()
            rows = rows[: len(rows) // ROW_MULTIPLE * ROW_MULTIPLE]
            out = kernel(
                q[:, :, rows],
                k[:, :, :tail],
                v[:, :, :tail],
                attn_mask=mask[None, None][:, :, rows, :tail],
                scale=0.125,
            )[0][0]
            if torch.equal(out, reference[:, rows]):
                tails.append(tail)
    if block not in tails or not _exp_ignores_position(generator):
        return None
    return tuple(tails)


def _exp_ignores_position(generator: torch.Generator) -> bool:
    """Whether `torch.exp` gives an element the same bits at any position of a tensor (a
    vectorized loop's body and its scalar tail may compute it differently): the fold of a
    query's blocks (`flash_blocks.fold_blocks`) relies on it."""
    x = torch.randn(4099, generator=generator) * 8
    bulk = torch.exp(x)
    for length in (1, 3, 7, 15, 17, 31, 33, 63, 65):
        for start in (0, 5, 4099 - length):
            if not torch.equal(torch.exp(x[start : start + length]), bulk[start : start + length]):
                return False
    return True
