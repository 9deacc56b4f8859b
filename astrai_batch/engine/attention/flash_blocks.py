"""Batch-invariant attention in torch's CPU flash kernel: one call per class of elements (a
prefill chunk, decodes with the same key length), keys in fixed blocks of 64-512 keys by
position (the length probed at start).

Why a query's result is the same alone or in any crowd, as a decode or inside a prefill
chunk, is in `flash_block_plan` (the three rules the plan keeps); `flash_probe` checks them
on the engine's CPU at start, and where they do not hold the engine keeps the block attention
(`block_attention`, the same promise in many more operators). A query past one block gets
each block from its own element and `fold_blocks` folds them here, so a whole prefix block
that several decodes share is computed once for all of them (the cascade's saving).

Sinks (`score_features`) need the row's log-sum-exp: a query in one block scales the kernel's
output by 1 / (1 + exp(sink - lse)); a longer query's fold counts the sink as one more
weight after its last block. A query's route (one block or folded) is set by its position
alone, so it gets the same operations in every step. Softcapping cannot enter this kernel:
a softcapped model keeps the block attention.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashMerge


def flash_kernel():
    """torch's CPU flash attention: (output [B, H, Lq, D], logsumexp)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def flash_block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: FlashBlockBatch,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (every query of the step) -> [T, Hq, Dv]. `sinks`: [Hq] or None."""
    num_tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    width = v_cache.shape[-1]
    out = q.new_empty(num_tokens, q_heads, width)
    merge = batch.merge
    if merge is not None:  # every block of every longer query: its output and log-sum-exp
        slots = merge.rows.shape[0] * merge.blocks
        block_out = q.new_zeros(slots, q_heads, width)
        block_lse = q.new_full((slots, q_heads), float("-inf"), dtype=torch.float32)
    kernel = flash_kernel()
    for call in batch.calls:
        b, t, rows = call.elements, call.tokens, group * call.tokens
        picked = q.index_select(0, call.token_index)
        queries = q.new_zeros(b, kv_heads, call.query_rows, head_dim)
        # [b * t, Hq, D] -> [b, Hkv, G, t, D]: rows in (group member, token) order
        queries[:, :, :rows].view(b, kv_heads, group, t, head_dim).copy_(
            picked.view(b, t, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        )
        gather, tables, page = batch.gatherer.gather_heads, call.page_tables, batch.page_size
        keys = gather("key", k_cache, tables, page, call.keys, batch.row_memo)
        values = gather("value", v_cache, tables, page, call.keys, batch.row_memo)
        result, lse = kernel(
            queries, keys.to(q.dtype), values.to(q.dtype), attn_mask=call.mask, scale=scale
        )
        # [b, Hkv, rows, Dv] -> [b * t, Hq, Dv]
        result = result[:, :, :rows].reshape(b, kv_heads, group, t, width).permute(0, 3, 1, 2, 4)
        result = result.reshape(b * t, q_heads, width)
        if not call.merged and sinks is None:
            out.index_copy_(0, call.slots, result)
            continue
        lse = lse[:, :, :rows].reshape(b, kv_heads, group, t).permute(0, 3, 1, 2)
        lse = lse.reshape(b * t, q_heads)
        if not call.merged:  # one block and a sink: its share of the softmax
            weight = (sinks.detach().float()[None, :] - lse).exp_().add_(1.0).reciprocal_()
            out.index_copy_(0, call.slots, (result * weight[:, :, None]).to(q.dtype))
            continue
        block_out.index_copy_(0, call.slots, result)
        block_lse.index_copy_(0, call.slots, lse)
    if merge is not None:
        folded = fold_blocks(block_out, block_lse, merge, sinks)
        out.index_copy_(0, merge.rows, folded.to(q.dtype))
    return out


def fold_blocks(
    block_out: torch.Tensor,
    block_lse: torch.Tensor,
    merge: FlashMerge,
    sinks: torch.Tensor | None = None,
):
    """Each longer query's blocks folded in block order: sum_b exp(lse_b - max) out_b over
    sum_b exp(lse_b - max). Absent blocks (past a query's last) have lse -inf: weight 0.
    Every step is elementwise with one rounding each (the maximum exact; products and sums
    as separate operations, never a fused multiply-add, whose vectorized and scalar forms
    round differently), the blocks added in block order; `flash_probe` checks that the
    exponential gives an element the same bits wherever it sits in a tensor."""
    count, q_heads, width = merge.rows.shape[0], block_out.shape[1], block_out.shape[2]
    lse = block_lse.view(count, merge.blocks, q_heads)
    outs = block_out.view(count, merge.blocks, q_heads, width)
    top = lse.amax(dim=1, keepdim=True)  # [M, 1, Hq]
    if sinks is not None:
        sink = sinks.detach().float().view(1, 1, q_heads)
        top = torch.maximum(top, sink)
    weights = torch.exp(lse - top)  # [M, blocks, Hq]
    total = outs[:, 0] * weights[:, 0, :, None]
    norm = weights[:, 0].clone()
    for b in range(1, merge.blocks):
        total += outs[:, b] * weights[:, b, :, None]
        norm += weights[:, b]
    if sinks is not None:  # the sink's column, after the last block
        norm += torch.exp(sink - top)[:, 0]
    return total / norm[:, :, None]
