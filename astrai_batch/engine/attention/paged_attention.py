"""Paged attention for a packed, ragged batch, as a transformers attention function.

The model runs on one packed "batch" of shape [1, T]: the new tokens of every scheduled
sequence side by side, each with its own position. transformers computes q/k/v (RoPE applied)
and calls the function registered here once per layer. It writes the new keys and values into
the paged pool at their slots, then attends each query token to its own sequence's keys, read
back from the pool:

- decode tokens (one new token per sequence) run as one batched SDPA over the gathered,
  padded context of all decoding sequences, with a key-padding mask;
- prefill chunks run one SDPA per sequence with an offset causal mask; a chunk that starts at
  position 0 attends to its own fresh keys directly (no gather, no mask).

Grouped-query attention never repeats keys: the query heads sharing a KV head are folded into
the query-length axis, so each SDPA call sees [kv_heads, group * q_len, head_dim].
The step's metadata (slots, gathers, masks) is built once per step and shared by all layers;
a model with sliding windows gets it as `WindowPlans`, and each layer takes the plan for the
window transformers passes it (`score_features`). Sinks (`s_aux`) and softcapping reach the
paths that apply them; any other path raises rather than compute without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai_batch.engine.attention.block_attention import block_attention
from astrai_batch.engine.attention.block_plan import BlockBatch
from astrai_batch.engine.attention.cascade import cascade_attention
from astrai_batch.engine.attention.cascade_plan import CascadeBatch
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch
from astrai_batch.engine.attention.flash_blocks import flash_block_attention
from astrai_batch.engine.attention.kernels.interface import KernelBatch
from astrai_batch.engine.attention.kernels.invariant_batch import InvariantKernelBatch
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.score_features import WindowPlans
from astrai_batch.engine.attention.static_decode import StaticDecodeBatch, static_decode_attention

ATTENTION_NAME = "astrai_paged"
BATCH_KWARG = "astrai_attention_batch"
# True: the caller wrote this step's keys and values into the pool already (`fused_layers`)
KV_WRITTEN_KWARG = "astrai_kv_written"


@dataclass(frozen=True)
class PrefillSpan:
    """One sequence's chunk of new tokens: rows [token_start, token_end) of the packed batch."""

    token_start: int
    token_end: int
    context_start: int  # position of the chunk's first token = keys already in the pool
    page_table: torch.Tensor | None  # [pages] covering the context, None when context_start == 0
    causal_mask: torch.Tensor | None  # [n, context_start + n] bool, None when context_start == 0


@dataclass(frozen=True)
class DecodeGroup:
    """All sequences that add exactly one token this step."""

    token_index: torch.Tensor  # [N] rows of the packed batch
    page_tables: torch.Tensor  # [N, pages] each sequence's pages, padded with page 0
    key_mask: torch.Tensor  # [N, 1, 1, pages * page_size] bool: True where the key exists


@dataclass
class AttentionBatch:
    """What every layer needs to know about this step; built once by the runner."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    write_slots: torch.Tensor  # [T]
    longest_context: int  # the most tokens any sequence of the step has (context + new)
    decode: DecodeGroup | None  # decodes without a shared prefix (padded)
    cascade: CascadeBatch | None  # decodes attended as shared prefix + own tail
    prefills: list[PrefillSpan]
    gatherer: PageGatherer  # the runner's reusable gather buffers


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    batch: (
        AttentionBatch
        | BlockBatch
        | FlashBlockBatch
        | InvariantKernelBatch
        | KernelBatch
        | StaticDecodeBatch
        | None
    ) = kwargs.get(BATCH_KWARG)
    if batch is None:
        raise RuntimeError(
            f"the '{ATTENTION_NAME}' attention needs the engine's step metadata; "
            "this model is owned by an astrai-batch ModelRunner"
        )
    window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    if isinstance(batch, WindowPlans):  # the plan for this layer's window (or full)
        batch = batch.plan(window)
    # the window comes per call
    takes_window = isinstance(batch, (InvariantKernelBatch, StaticDecodeBatch))
    binds = window is not None and window < batch.longest_context
    if binds and not takes_window and window != _window(batch):
        raise RuntimeError(
            f"a sliding window of {window} tokens would cut a {batch.longest_context}-token "
            f"sequence, and this step's {type(batch).__name__} was planned without it"
        )
    if (softcap is not None or sinks is not None) and not isinstance(
        batch, (BlockBatch, FlashBlockBatch, InvariantKernelBatch, StaticDecodeBatch)
    ):
        raise RuntimeError(
            f"the {type(batch).__name__} attention path applies no sinks or softcapping"
        )
    if value.shape[-1] < key.shape[-1]:
        return _narrow_values(module, query, key, value, attention_mask, scaling, **kwargs)
    layer = module.layer_idx
    # query [1, Hq, T, D]; key/value [1, Hkv, T, D] -> token-major [T, H, D]
    q = query[0].transpose(0, 1)
    k_new = key[0].transpose(0, 1)
    v_new = value[0].transpose(0, 1)
    k_cache = batch.key_cache[layer]
    v_cache = batch.value_cache[layer]
    if not kwargs.get(KV_WRITTEN_KWARG, False):
        k_cache.index_copy_(0, batch.write_slots, k_new.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.write_slots, v_new.to(v_cache.dtype))

    num_tokens, q_heads, head_dim = q.shape
    scale = scaling if scaling is not None else head_dim**-0.5
    if isinstance(batch, FlashBlockBatch):  # invariant numerics on the CPU's flash kernel
        if softcap is not None:
            raise RuntimeError("the CPU flash-kernel attention cannot apply softcapping")
        out = flash_block_attention(q, k_cache, v_cache, batch, scale, sinks)
        return out.to(q.dtype).unsqueeze(0), None
    if isinstance(batch, InvariantKernelBatch):  # CUDA's Triton kernel, the CPU's C kernel
        ends = {} if batch.token_key_ends is None else {"key_ends": batch.token_key_ends}
        out = batch.attend(
            q,
            k_cache,
            v_cache,
            batch.tables,
            batch.token_table,
            batch.token_keys,
            batch.page_size,
            scale,
            window=window,
            softcap=softcap,
            sinks=sinks,
            **ends,
        )
        return out.to(q.dtype).unsqueeze(0), None
    if isinstance(batch, BlockBatch):
        out = block_attention(q, k_cache, v_cache, batch, scale, softcap, sinks)
        return out.to(q.dtype).unsqueeze(0), None
    if isinstance(batch, KernelBatch):  # a paged CUDA kernel: every query in one call
        out = batch.kernel.attend(q, k_cache, v_cache, scale)
        return out.to(q.dtype).unsqueeze(0), None
    if isinstance(batch, StaticDecodeBatch):  # a decode-only step at a graph bucket's shape
        out = static_decode_attention(q, k_cache, v_cache, batch, scale, window, softcap, sinks)
        return out.to(q.dtype).unsqueeze(0), None
    kv_heads = k_new.shape[1]
    group = q_heads // kv_heads
    out = q.new_empty(num_tokens, q_heads, v_new.shape[-1])

    decode = batch.decode
    if decode is not None:
        n = decode.token_index.shape[0]
        # [N, Hq, D] -> [N, Hkv, G, D]: a decode query has length 1, so the group is its length
        qd = q.index_select(0, decode.token_index).view(n, kv_heads, group, head_dim)
        kd = batch.gatherer.gather("key", k_cache, decode.page_tables, batch.page_size)
        vd = batch.gatherer.gather("value", v_cache, decode.page_tables, batch.page_size)
        kd, vd = kd.transpose(1, 2), vd.transpose(1, 2)
        od = F.scaled_dot_product_attention(
            qd, kd.to(qd.dtype), vd.to(qd.dtype), attn_mask=decode.key_mask, scale=scaling
        )
        out.index_copy_(0, decode.token_index, od.reshape(n, q_heads, -1))

    cascade = batch.cascade
    if cascade is not None:
        n = cascade.token_index.shape[0]
        qc = q.index_select(0, cascade.token_index).view(n, kv_heads, group, head_dim)
        oc = cascade_attention(
            qc, k_cache, v_cache, cascade, batch.page_size, scale, batch.gatherer
        )
        out.index_copy_(0, cascade.token_index, oc.reshape(n, q_heads, -1))

    for span in batch.prefills:
        qs = q[span.token_start : span.token_end]  # [n, Hq, D]
        n = qs.shape[0]
        # [n, Hq, D] -> [Hkv, G * n, D]
        qs = qs.permute(1, 0, 2).reshape(kv_heads, group * n, head_dim)
        if span.page_table is None:
            ks = k_new[span.token_start : span.token_end].transpose(0, 1)
            vs = v_new[span.token_start : span.token_end].transpose(0, 1)
            mask = _causal_mask(n, n, group, q.device)
        else:
            kv_len = span.causal_mask.shape[1]
            table = span.page_table.unsqueeze(0)
            ks = batch.gatherer.gather("key", k_cache, table, batch.page_size)[0, :kv_len]
            vs = batch.gatherer.gather("value", v_cache, table, batch.page_size)[0, :kv_len]
            ks, vs = ks.transpose(0, 1), vs.transpose(0, 1)
            ks, vs = ks.to(qs.dtype), vs.to(qs.dtype)
            mask = span.causal_mask.repeat(group, 1)
        # 4-D inputs: torch's CPU flash kernel takes only those (3-D falls back to the math
        # path, measured 3x slower on a 290-token span)
        os_ = F.scaled_dot_product_attention(
            qs.unsqueeze(0),
            ks.unsqueeze(0),
            vs.unsqueeze(0),
            attn_mask=mask[None, None],
            scale=scaling,
        )[0]
        # [Hkv, G * n, D] -> [n, Hq, D]
        out[span.token_start : span.token_end] = os_.view(q_heads, n, -1).transpose(0, 1)

    return out.unsqueeze(0), None


def _narrow_values(module, query, key, value, attention_mask, scaling, **kwargs):
    """Multi-head latent attention's values are narrower than its keys (DeepSeek V3: 128 vs
    192): the pool holds one width, so values are stored zero-padded to the keys' and the
    padded output columns (each a sum of zeros) dropped; the kept columns are computed exactly
    as unpadded ones (a column of P x V depends on its own value column alone)."""
    width = value.shape[-1]
    padded = F.pad(value, (0, key.shape[-1] - width))
    out, _ = paged_attention(module, query, key, padded, attention_mask, scaling, **kwargs)
    return out[..., :width], None


def _window(batch) -> int | None:
    """The window a step's plan was made for (None: full attention)."""
    return getattr(batch, "window", None)


def _causal_mask(q_len: int, kv_len: int, group: int, device: torch.device) -> torch.Tensor:
    """[group * q_len, kv_len] bool: query i (key position kv_len - q_len + i) sees keys <= it."""
    offset = kv_len - q_len
    rows = torch.arange(q_len, device=device).unsqueeze(1) + offset
    cols = torch.arange(kv_len, device=device).unsqueeze(0)
    return (cols <= rows).repeat(group, 1)


def offset_causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len] bool causal mask for a chunk whose first query sits at kv_len - q_len."""
    return _causal_mask(q_len, kv_len, 1, device)


def register_paged_attention() -> None:
    """Makes the paged attention selectable as `attn_implementation="astrai_paged"`.

    transformers keeps registered functions in its own process-wide table; registering the
    same function again is harmless. Mask creation is skipped for names it does not know,
    which is what we want: masks come from the step metadata.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
