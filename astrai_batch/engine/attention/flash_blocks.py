"""Batch-invariant attention in torch's CPU flash kernel: one call per prefill chunk and one
per class of decodes, each query's keys split into fixed 512-key blocks by position.

Why a query's result is the same alone or in any crowd, as a decode or inside a prefill
chunk, is in `flash_block_plan` (the three rules the plan keeps); `flash_probe` checks them
on the engine's CPU at start, and where they do not hold the engine keeps the block attention
(`block_attention`, the same promise in many more operators). The cascade's saving (shared
prefix keys read once for a group) has no place here: a query's 512-key blocks are folded
inside one kernel call, so its shared keys are read with its own.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.flash_block_plan import (
    ROW_MULTIPLE,
    FlashBlockBatch,
    FlashMerge,
)


def flash_kernel():
    """torch's CPU flash attention: (output [B, H, Lq, D], logsumexp)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def flash_block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: FlashBlockBatch,
    scale: float,
) -> torch.Tensor:
    """q [T, Hq, D] (every query of the step) -> [T, Hq, Dv]."""
    num_tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    width = v_cache.shape[-1]
    out = q.new_empty(num_tokens, q_heads, width)
    merge = batch.merge
    if merge is not None:  # every block of every longer query: its output and log-sum-exp
        slots = merge.rows.shape[0] * merge.blocks
        block_out = q.new_zeros(slots, q_heads, width)
        block_lse = q.new_zeros(slots, q_heads, dtype=torch.float32)
    kernel = flash_kernel()
    for call in batch.calls:
        b, t, rows = call.elements, call.tokens, group * call.tokens
        picked = q.index_select(0, call.token_index)
        queries = q.new_zeros(b, kv_heads, call.query_rows, head_dim)
        # [b * t, Hq, D] -> [b, Hkv, G, t, D]: rows in (group member, token) order
        queries[:, :, :rows].view(b, kv_heads, group, t, head_dim).copy_(
            picked.view(b, t, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        )
        keys = batch.gatherer.gather("key", k_cache, call.page_tables, batch.page_size)
        values = batch.gatherer.gather("value", v_cache, call.page_tables, batch.page_size)
        result, lse = kernel(
            queries,
            keys[:, : call.keys].transpose(1, 2).to(q.dtype),
            values[:, : call.keys].transpose(1, 2).to(q.dtype),
            attn_mask=call.mask,
            scale=scale,
        )
        # [b, Hkv, rows, Dv] -> [b * t, Hq, Dv]
        result = result[:, :, :rows].reshape(b, kv_heads, group, t, width).permute(0, 3, 1, 2, 4)
        result = result.reshape(b * t, q_heads, width)
        if not call.merged:
            out.index_copy_(0, call.slots, result)
            continue
        lse = lse[:, :, :rows].reshape(b, kv_heads, group, t).permute(0, 3, 1, 2)
        block_out.index_copy_(0, call.slots, result)
        block_lse.index_copy_(0, call.slots, lse.reshape(b * t, q_heads))
    if merge is not None:
        out.index_copy_(0, merge.rows, fold_blocks(block_out, block_lse, merge, kernel))
    return out


def fold_blocks(block_out: torch.Tensor, block_lse: torch.Tensor, merge: FlashMerge, kernel):
    """Each longer query's blocks folded in block order: sum_b exp(lse_b - max) out_b over
    sum_b exp(lse_b - max). Folded by the kernel itself, as attention whose keys are the
    blocks: a one-hot query scores key b as lse_b exactly (1 x lse_b plus zero products),
    and its values are the block outputs; every exponential and sum then runs per row
    over a fixed length (`merge.keys`, a probed tail), never by a vectorized loop whose
    tail would follow the step's size."""
    count, q_heads, width = merge.rows.shape[0], block_out.shape[1], block_out.shape[2]
    blocks = merge.blocks
    keys = block_out.new_zeros(count, q_heads, merge.keys, width)
    keys[:, :, :blocks, 0] = block_lse.view(count, blocks, q_heads).transpose(1, 2)
    values = block_out.new_zeros(count, q_heads, merge.keys, width)
    values[:, :, :blocks] = block_out.view(count, blocks, q_heads, width).transpose(1, 2)
    query = block_out.new_zeros(1, 1, ROW_MULTIPLE, width)
    query[0, 0, 0, 0] = 1.0
    query = query.expand(count, q_heads, ROW_MULTIPLE, width)
    return kernel(query, keys, values, attn_mask=merge.mask, scale=1.0)[0][:, :, 0]
