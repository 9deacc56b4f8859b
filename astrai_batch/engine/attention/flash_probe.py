"""Whether torch's CPU flash kernel keeps the rules `flash_block_plan` relies on, here.

Measured on AMD Zen 4/5 with torch 2.13's MKL: a query row's output differs from the same
row in another call only when it sits in a last query block of 1-3 rows; calls of any
row count that is a multiple of 4 (query blocks of 32, 64 or 256 rows), any batch, and key
lengths of 512 or 1024 with the second block fully masked give every row the same bits; a
last key block of 64, 128, 192, 384 or 448 keys gives the full block's bits, one of 256 or
320 does not (the BLAS sums those P x V GEMMs' keys in other chunks).
Another CPU, BLAS or torch may differ, so the engine asks this probe before it plans calls
that way, with the model's head size, KV heads and dtype; where it fails, the engine keeps the
block attention. A few dozen kernel calls (SmolLM2's shapes: about 0.1 s).
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.flash_block_types import KEY_BLOCK, ROW_MULTIPLE, TAIL_STEP
from astrai_batch.engine.attention.flash_blocks import flash_kernel

# call row counts: every query-block size (32, 64, 256) with remainders 0 and 4, and small
PROBE_ROWS = (4, 8, 12, 16, 32, 36, 60, 64, 68, 188, 192, 196, 252, 256, 260, 764, 768, 772)
REFERENCE_ROWS = 1040  # 4 x 256 + 16: the 256-row split, its own remainder a multiple of 4
PROBE_SEED = 25


def invariant_tails(head_dim: int, kv_heads: int, dtype: torch.dtype) -> tuple[int, ...] | None:
    """The last-block key lengths whose rows get the reference call's bits, ascending (512
    among them), when every probed row count and shape does too and the exponential ignores
    an element's position; else None."""
    if ROW_MULTIPLE != 4 or KEY_BLOCK != 512:
        raise AssertionError("the probe's row counts assume ROW_MULTIPLE 4 and KEY_BLOCK 512")
    generator = torch.Generator().manual_seed(PROBE_SEED)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    keys = 2 * KEY_BLOCK
    q = randn(1, kv_heads, REFERENCE_ROWS, head_dim)
    k = randn(1, kv_heads, keys, head_dim)
    v = randn(1, kv_heads, keys, head_dim)
    # each group of 4 rows shares a query position: 4 rows are also one decode's folded rows
    positions = torch.randint(0, keys, (REFERENCE_ROWS // 4,), generator=generator)
    positions = positions.repeat_interleave(4)
    positions[: REFERENCE_ROWS // 2] %= KEY_BLOCK  # half the rows end in the first block
    mask = torch.zeros(REFERENCE_ROWS, keys, dtype=dtype)
    mask.masked_fill_(torch.arange(keys)[None, :] > positions[:, None], float("-inf"))
    kernel = flash_kernel()
    with torch.inference_mode():
        reference = kernel(q, k, v, attn_mask=mask[None, None], scale=0.125)[0][0]

        def same(rows: slice, out: torch.Tensor) -> bool:
            return torch.equal(out, reference[:, rows])

        for m in PROBE_ROWS:  # a prefill chunk's shape: one element, m rows
            for first in {0, REFERENCE_ROWS - m}:
                rows = slice(first, first + m)
                out = kernel(q[:, :, rows], k, v, attn_mask=mask[None, None, rows], scale=0.125)
                if not same(rows, out[0][0]):
                    return None
        # the first block alone (a key length of 512) for rows that end in it, with the
        # masked keys' contents changed: they must not count
        rows = slice(0, 64)
        k1, v1 = k[:, :, :KEY_BLOCK].clone(), v[:, :, :KEY_BLOCK].clone()
        last = int(positions[rows].max())
        k1[:, :, last + 1 :] = randn(1, kv_heads, KEY_BLOCK - last - 1, head_dim)
        v1[:, :, last + 1 :] = randn(1, kv_heads, KEY_BLOCK - last - 1, head_dim)
        short = mask[None, None, rows, :KEY_BLOCK]
        if not same(rows, kernel(q[:, :, rows], k1, v1, attn_mask=short, scale=0.125)[0][0]):
            return None
        # decodes' shape: elements of 4 rows, each its own mask row broadcast over its rows
        for first in (0, REFERENCE_ROWS - 12, REFERENCE_ROWS // 2 - 8):
            qs = q[0, :, first : first + 12].reshape(kv_heads, 3, 4, head_dim).transpose(0, 1)
            ms = mask[first : first + 12 : 4].view(3, 1, 1, keys)
            kk, vv = k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1)
            out = kernel(qs.contiguous(), kk, vv, attn_mask=ms, scale=0.125)[0]
            if not same(slice(first, first + 12), out.transpose(0, 1).reshape(kv_heads, 12, -1)):
                return None
        # a last block shorter than 512 keys, in the first block and after a full one
        tails = []
        for tail in range(TAIL_STEP, KEY_BLOCK + 1, TAIL_STEP):
            fits = True
            for blocks in (0, 1):
                ends = blocks * KEY_BLOCK
                rows = ((positions >= ends) & (positions < ends + tail)).nonzero().flatten()
                rows = rows[: len(rows) // ROW_MULTIPLE * ROW_MULTIPLE]
                keys = slice(0, ends + tail)
                out = kernel(
                    q[:, :, rows],
                    k[:, :, keys],
                    v[:, :, keys],
                    attn_mask=mask[None, None][:, :, rows, keys],
                    scale=0.125,
                )[0][0]
                fits = fits and torch.equal(out, reference[:, rows])
            if fits:
                tails.append(tail)
    if KEY_BLOCK not in tails or not _exp_ignores_position(generator):
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
