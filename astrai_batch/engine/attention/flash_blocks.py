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

from astrai_batch.engine.attention.flash_block_plan import FlashBlockBatch


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
    kernel = flash_kernel()
    for call in batch.calls:
        b, t, rows = call.elements, call.tokens, group * call.tokens
        if call.first_row is not None:
            picked = q[call.first_row : call.first_row + b * t]
        else:
            picked = q.index_select(0, call.rows)
        queries = q.new_zeros(b, kv_heads, call.query_rows, head_dim)
        # [b * t, Hq, D] -> [b, Hkv, G, t, D]: rows in (group member, token) order
        queries[:, :, :rows].view(b, kv_heads, group, t, head_dim).copy_(
            picked.view(b, t, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        )
        keys = batch.gatherer.gather("key", k_cache, call.page_tables, batch.page_size)
        values = batch.gatherer.gather("value", v_cache, call.page_tables, batch.page_size)
        result = kernel(
            queries,
            keys[:, : call.keys].transpose(1, 2).to(q.dtype),
            values[:, : call.keys].transpose(1, 2).to(q.dtype),
            attn_mask=call.mask,
            scale=scale,
        )[0]
        # [b, Hkv, rows, Dv] -> [b * t, Hq, Dv]
        result = result[:, :, :rows].reshape(b, kv_heads, group, t, width).permute(0, 3, 1, 2, 4)
        if call.first_row is not None:
            out[call.first_row : call.first_row + b * t] = result.reshape(b * t, q_heads, width)
        else:
            out.index_copy_(0, call.rows, result.reshape(b * t, q_heads, width))
    return out
