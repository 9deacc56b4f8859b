"""Pure-torch paged kernels that read a step's keys only through the kernels' metadata.

Each implements the runner's `PagedKernel` interface, so the engine runs with it on a CPU
exactly as it would with FlashInfer or flash-attn on a GPU: same `KernelBatch`, same pool,
same per-layer call. `CsrReference` finds a chunk's keys the way FlashInfer does (qo_indptr,
kv_indptr, kv_indices, last_page_len), `BlockTableReference` the way flash-attn does
(cu_seqlens_q, cu_seqlens_k, block_table). Neither looks at the step's page-table matrix or
positions, so agreeing with the SDPA path proves the metadata is right. The attention itself
is written out (scores, a bottom-right-aligned causal mask, softmax), not taken from SDPA.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.kernels.interface import paged_view
from astrai_batch.engine.attention.kernels.paged_kv_metadata import PagedKVMetadata


class _Reference:
    name = "reference"

    def __init__(self) -> None:
        self.meta: PagedKVMetadata | None = None
        self.calls = 0  # attend calls (one per layer and step)

    def begin_step(self, metadata: PagedKVMetadata) -> None:
        self.meta = metadata

    def attend(self, q, k_cache, v_cache, scale):
        meta = self.meta
        k_pages = paged_view(k_cache, meta.page_size)
        v_pages = paged_view(v_cache, meta.page_size)
        out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
        for i in range(meta.num_chunks):
            lo, hi = int(meta.qo_indptr[i]), int(meta.qo_indptr[i + 1])
            pages, kv_len = self.keys_of(i)
            keys = k_pages[pages].flatten(0, 1)[:kv_len]
            values = v_pages[pages].flatten(0, 1)[:kv_len]
            out[lo:hi] = causal_attention(q[lo:hi], keys, values, scale)
        self.calls += 1
        return out

    def keys_of(self, chunk: int) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


class CsrReference(_Reference):
    """FlashInfer's form: pages kv_indices[kv_indptr[i]:kv_indptr[i+1]], the last one
    holding last_page_len[i] keys."""

    name = "csr-reference"

    def keys_of(self, chunk):
        meta = self.meta
        first, last = int(meta.kv_indptr[chunk]), int(meta.kv_indptr[chunk + 1])
        pages = torch.from_numpy(meta.kv_indices[first:last]).long()
        kv_len = (last - first - 1) * meta.page_size + int(meta.last_page_len[chunk])
        return pages, kv_len


class BlockTableReference(_Reference):
    """flash-attn's form: the key count from cu_seqlens_k, the pages from block_table."""

    name = "block-table-reference"

    def keys_of(self, chunk):
        meta = self.meta
        kv_len = int(meta.cu_seqlens_k[chunk + 1] - meta.cu_seqlens_k[chunk])
        pages = torch.from_numpy(meta.block_table[chunk, : -(-kv_len // meta.page_size)]).long()
        return pages, kv_len


def causal_attention(q, k, v, scale):
    """q [n, Hq, D] the last n of L positions; k, v [L, Hkv, D] -> [n, Hq, Dv]."""
    n, q_heads, _ = q.shape
    kv_len, kv_heads, _ = k.shape
    group = q_heads // kv_heads
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    allowed = torch.arange(kv_len)[None, :] <= torch.arange(n)[:, None] + (kv_len - n)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(dim=-1), v).to(q.dtype)
