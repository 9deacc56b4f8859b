"""Decode attention at a fixed shape: what a captured CUDA graph replays.

A graph replays the kernels it recorded, with the shapes it recorded, reading whatever its
input tensors hold at replay time. So this attention has no host synchronization, no Python
lists built from the step, and no shape that depends on the data: B query rows (the batch
bucket, padding rows included) each attend W key blocks of `block_tokens` positions (the
width bucket) through a [B, W * pages_per_block] page table, and which keys exist is a mask
computed on the device from the rows' positions.

Invariant numerics: a row's result must be bitwise what `block_attention` gives the same
decode in any step, graphed or not, in whichever bucket. So every (row, block) pair is a
*private unit* exactly as `block_attention` computes one (same GEMM shapes per unit, same
layouts, same masked fill, the exact row max, block sums of a fixed length), and a row's
blocks are added in block order, one addition per block: blocks past a row's last one are
fully masked, their probabilities are exact zeros, and they add exact zeros. Fast numerics:
one masked SDPA over the gathered, padded context.

A layer's sliding window, softcap and sinks come with each call (`score_features`), as the
eager steps get them: the window masks keys at positions <= p - W (the blocks wholly before
it are then fully masked: exact zeros again, where `block_attention` skips them), the softcap
is applied to each score before its mask, and a sink joins the row max and adds
exp(sink - max) to the row's sum after its last block, each as `block_attention` does it; the
CUDA kernel takes all three as it does in an eager step. All three are per-layer constants,
so a captured graph replays them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai_batch.engine.attention.block_attention import NEG
from astrai_batch.engine.attention.score_features import apply_softcap
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO, RowScheme, pad_gemm_rows


@dataclass(frozen=True)
class StaticDecodeBatch:
    """Views of the graph's static inputs for one bucket; every layer reads the same ones."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    block_tokens: int
    num_blocks: int  # W: key blocks every row attends (the width bucket)
    write_slots: torch.Tensor  # [B] padding rows write into the scratch page
    positions: torch.Tensor  # [B] each row's query position (keys 0..position exist)
    page_tables: torch.Tensor  # [B, W * pages_per_block], zero past a row's pages
    longest_context: int  # the bucket's width in tokens (the sliding-window guard reads it)
    invariant: bool
    gemm_rows: RowScheme = ROWS_AT_LEAST_TWO  # the block attention's GEMM row padding
    # invariant numerics on CUDA: the eager steps' Triton kernel (`invariant_triton`), so a
    # graphed decode gets the bits an eager one gets
    invariant_kernel: Callable[..., torch.Tensor] | None = None
    token_rows: torch.Tensor | None = None  # [B] int32: row i reads page-table row i
    token_keys: torch.Tensor | None = None  # [B] positions + 1, set before each forward


def static_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: StaticDecodeBatch,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] (one query per row) -> [B, Hq, Dv]. `window`, `softcap`, `sinks` [Hq]:
    the layer's (`score_features`), None where it has none."""
    if batch.invariant and batch.invariant_kernel is not None:
        return batch.invariant_kernel(
            q,
            k_cache,
            v_cache,
            batch.page_tables,
            batch.token_rows,
            batch.token_keys,
            batch.page_size,
            scale,
            window=window,
            softcap=softcap,
            sinks=sinks,
        )
    if batch.invariant:
        return _blocked(q, k_cache, v_cache, batch, scale, window, softcap, sinks)
    if softcap is not None or sinks is not None:
        return _padded_math(q, k_cache, v_cache, batch, scale, window, softcap, sinks)
    return _padded_sdpa(q, k_cache, v_cache, batch, scale, window)


def _blocked(
    q, k_cache, v_cache, batch: StaticDecodeBatch, scale: float, window, softcap, sinks
) -> torch.Tensor:
    rows, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    blocks, block = batch.num_blocks, batch.block_tokens
    # units in block-major order: unit w * rows + i is row i's block w
    tables = _block_major(batch.page_tables, blocks)
    qg = q.reshape(rows, kv_heads, group, head_dim)
    keys = _gather(k_cache, tables, batch.page_size)
    a = pad_gemm_rows(
        qg.repeat(blocks, 1, 1, 1), batch.gemm_rows
    )  # [U, Hkv, G', D], as block_attention
    scores = torch.matmul(a, keys.permute(0, 2, 3, 1).to(a.dtype))
    scores = apply_softcap(scores.float()[:, :, :group].mul_(scale), softcap)
    scores.masked_fill_(_key_masked(batch.positions, blocks, block, window), NEG)
    row_max = scores.amax(dim=-1).unflatten(0, (blocks, rows)).amax(dim=0)  # exact, any order
    if sinks is not None:
        sink = sinks.detach().float().view(1, kv_heads, group)
        row_max = torch.maximum(row_max, sink)
    probs = scores.sub_(row_max.repeat(blocks, 1, 1).unsqueeze(-1)).exp_()
    sums = probs.sum(dim=-1)  # [U, Hkv, G]
    p = pad_gemm_rows(probs, batch.gemm_rows)
    vals = _gather(v_cache, tables, batch.page_size)
    out = torch.matmul(p.to(vals.dtype), vals.permute(0, 2, 1, 3)).float()[:, :, :group]
    out = out.unflatten(0, (blocks, rows))
    sums = sums.unflatten(0, (blocks, rows))
    values = v_cache.shape[-1]
    total = q.new_zeros(rows, kv_heads, group, values, dtype=torch.float32)
    norm = q.new_zeros(rows, kv_heads, group, dtype=torch.float32)
    for b in range(blocks):  # block order, one addition per block and row
        total += out[b]
        norm += sums[b]
    if sinks is not None:  # the sink's column, after the last block
        norm += (sink - row_max).exp_()
    return total.div_(norm.unsqueeze(-1)).view(rows, q_heads, values)


def _padded_sdpa(
    q, k_cache, v_cache, batch: StaticDecodeBatch, scale: float, window: int | None
) -> torch.Tensor:
    rows, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    qd = q.reshape(rows, kv_heads, q_heads // kv_heads, head_dim)
    kd = _gather(k_cache, batch.page_tables, batch.page_size).transpose(1, 2)
    vd = _gather(v_cache, batch.page_tables, batch.page_size).transpose(1, 2)
    mask = _visible(batch, window).view(rows, 1, 1, -1)
    out = F.scaled_dot_product_attention(
        qd, kd.to(qd.dtype), vd.to(qd.dtype), attn_mask=mask, scale=scale
    )
    return out.reshape(rows, q_heads, -1)


def _padded_math(
    q, k_cache, v_cache, batch: StaticDecodeBatch, scale: float, window, softcap, sinks
) -> torch.Tensor:
    """Fast numerics with a softcap or sinks, which SDPA does not take: the softmax written
    out as transformers' eager attention writes it (scores, softcap, mask, the sink column)."""
    rows, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    qd = q.reshape(rows, kv_heads, group, head_dim)
    kd = _gather(k_cache, batch.page_tables, batch.page_size).permute(0, 2, 3, 1)
    vd = _gather(v_cache, batch.page_tables, batch.page_size).transpose(1, 2)
    scores = apply_softcap(torch.matmul(qd, kd.to(qd.dtype)).float().mul_(scale), softcap)
    scores.masked_fill_(~_visible(batch, window).view(rows, 1, 1, -1), NEG)
    if sinks is not None:
        sink = sinks.detach().float().view(1, kv_heads, group, 1).expand(rows, -1, -1, -1)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.matmul(probs.to(vd.dtype), vd)
    return out.reshape(rows, q_heads, -1)


def _visible(batch: StaticDecodeBatch, window: int | None) -> torch.Tensor:
    """[B, width] bool: the keys each row's query sees (its own and before, in its window)."""
    width = batch.num_blocks * batch.block_tokens
    keys = torch.arange(width, device=batch.positions.device)
    position = batch.positions.unsqueeze(1)
    visible = keys <= position
    if window is not None:
        visible &= keys > position - window
    return visible


def _block_major(page_tables: torch.Tensor, blocks: int) -> torch.Tensor:
    """[B, W * per_block] -> [W * B, per_block]: row i's block w at w * B + i."""
    rows = page_tables.shape[0]
    per_block = page_tables.shape[1] // blocks
    return page_tables.view(rows, blocks, per_block).transpose(0, 1).reshape(-1, per_block)


def _gather(cache: torch.Tensor, tables: torch.Tensor, page_size: int) -> torch.Tensor:
    """[N, pages] -> [N, pages * page_size, kv_heads, head_dim]: `PageGatherer.gather`'s layout,
    into a fresh tensor (inside a graph it comes from the graph's memory pool)."""
    slots, heads, dim = cache.shape
    by_page = cache.view(slots // page_size, page_size * heads * dim)
    rows, pages = tables.shape
    return by_page.index_select(0, tables.reshape(-1)).view(rows, pages * page_size, heads, dim)


def _key_masked(
    positions: torch.Tensor, blocks: int, block: int, window: int | None = None
) -> torch.Tensor:
    """[W * B, 1, 1, block] bool: key offset k of block w is masked for row i when
    w * block + k > positions[i], or <= positions[i] - window (the units' `masked_keys` of
    `block_plan`)."""
    starts = torch.arange(blocks, device=positions.device).mul_(block)
    offsets = positions.unsqueeze(0) - starts.unsqueeze(1)  # [W, B]
    keys = torch.arange(block, device=positions.device)
    masked = keys > offsets.unsqueeze(-1)
    if window is not None:
        masked |= keys <= offsets.unsqueeze(-1) - window
    return masked.view(-1, 1, 1, block)
