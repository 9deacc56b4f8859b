"""Batch-invariant paged attention for CUDA: one Triton program per (query token, KV head).

On the CPU, invariant attention pins the reduction order by calling torch's flash kernel at
fixed 512-key blocks (`flash_blocks`). On CUDA the shape-chosen kernels (cuBLAS's algorithm,
torch's reduction split, FlashAttention's split-KV and query tiles) cannot be pinned from
outside, so the order is fixed by construction here: a program computes exactly one query
token's attention for one KV head (its query heads of the group side by side) by walking the
token's keys from position 0 in blocks of `KEY_BLOCK`, an online softmax over the blocks in
order. Every shape inside a program is a compile-time constant, a program never reads another
token's queries, and how many blocks it walks depends on the token's own key count only: the
token's bits are the same alone, beside 255 decodes, inside a prefill chunk after a
preemption, or in a captured CUDA graph. Keys and values are read from the paged pool in
place through the page table (no gather of the context).

A sliding window starts the walk at the block holding the window's first key (keys before it
masked, -inf), a function of the token's own key count and the layer's window; a softcap
forms C * tanh(s / C) on each score before the mask (tanh from one exponential, elementwise);
a sink starts the running max at the head's sink logit and adds exp(sink - max) to the sum
after the last block. All three keep one program per token and its fixed walk.

The price is parallelism: no split of a long context over programs (split-KV is the very
reduction order that varies), so few sequences with long contexts run on few programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KEY_BLOCK = 64  # keys per step of a program's walk
MIN_DOT = 16  # tl.dot's smallest operand dimension on the GPU
NO_WINDOW = 1 << 30  # the window of a full-attention layer: longer than any context


@triton.jit
def _invariant_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    token_table_ptr,
    token_keys_ptr,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_table,
    scale,
    sinks_ptr,
    window,
    softcap,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    VALUE_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = tl.load(token_table_ptr + token).to(tl.int64)
    n_keys = tl.load(token_keys_ptr + token)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    dv = tl.arange(0, VALUE_PAD)
    heads = kv_head * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + token.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=q_mask,
        other=0.0,
    )
    if SINKS:
        sink = tl.load(sinks_ptr + heads, mask=g < GROUP, other=float("-inf"))
        m = sink
    else:
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, VALUE_PAD], tl.float32)
    offsets = tl.arange(0, BLOCK)
    first = tl.maximum(n_keys - window, 0)  # the window's first key (window: 2**30 if none)
    for start in range((first // BLOCK) * BLOCK, n_keys, BLOCK):
        key = start + offsets
        exists = (key < n_keys) & (key >= first)
        page = tl.load(tables_ptr + row * stride_table + key // PAGE_SIZE, mask=exists, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + key % PAGE_SIZE
        k = tl.load(
            k_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
            mask=exists[:, None] & (d[None, :] < HEAD_DIM),
            other=0.0,
        )
        if IEEE:  # noqa: SIM108 (a constexpr branch: Triton compiles one side)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        if SOFTCAP:  # C * tanh(s / C), tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|)
            x = s / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(x < 0, -t, t) * softcap
        s = tl.where(exists[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + slot[:, None] * stride_vs + kv_head * stride_vh + dv[None, :],
            mask=exists[:, None] & (dv[None, :] < VALUE_DIM),
            other=0.0,
        )
        if IEEE:  # noqa: SIM108
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    if SINKS:  # the sink's column, after the last block
        total = total + tl.exp(sink - m)
    out = acc / total[:, None]
    tl.store(
        out_ptr + token.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + dv[None, :],
        out,
        mask=(g[:, None] < GROUP) & (dv[None, :] < VALUE_DIM),
    )


def invariant_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    token_table: torch.Tensor,
    token_keys: torch.Tensor,
    page_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, Dv] float32. Token t attends to the first `token_keys[t]` keys
    of the sequence whose pages are row `token_table[t]` of `tables` [R, P] (page ids), the
    last `window` of them with a sliding window; `softcap` caps scores, `sinks` [Hq] adds a
    learned logit per query head to the softmax (`score_features`)."""
    num_tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    value_dim = v_cache.shape[-1]
    group = q_heads // kv_heads
    q = q.to(k_cache.dtype)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    out = torch.empty(num_tokens, q_heads, value_dim, device=q.device, dtype=torch.float32)
    if num_tokens == 0:
        return out
    sink_logits = out if sinks is None else sinks.detach().float().contiguous()
    _invariant_attention_kernel[(num_tokens, kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        tables,
        token_table,
        token_keys,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        tables.stride(0),
        float(scale),
        sink_logits,
        NO_WINDOW if window is None else int(window),
        1.0 if softcap is None else float(softcap),
        PAGE_SIZE=page_size,
        GROUP=group,
        GROUP_PAD=_padded(group),
        HEAD_DIM=head_dim,
        DIM_PAD=_padded(head_dim),
        VALUE_DIM=value_dim,
        VALUE_PAD=_padded(value_dim),
        BLOCK=KEY_BLOCK,
        IEEE=k_cache.dtype == torch.float32,
        SOFTCAP=softcap is not None,
        SINKS=sinks is not None,
        # no multiply-add contraction: every compiled variant (Triton specializes on argument
        # alignment: the eager and graphed steps' tables differ) rounds the same operations
        enable_fp_fusion=False,
    )
    return out


def _padded(n: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(n))
