"""The flash-attn backend: one `flash_attn_varlen_func` per layer over the paged pool.

Every chunk of the step is one varlen sequence: `cu_seqlens_q` cuts the packed queries,
`cu_seqlens_k` gives each its key count, `block_table` its pages in the pool, which is read
in place as `[num_pages, page_size, kv_heads, head_dim]`. `causal=True` aligns the mask to
the bottom right, which is exactly a chunk appended to its context (a decode sees all its
keys). GQA is the kernel's own. FA2 reads a paged cache only with pages (blocks) whose size
is a multiple of 256 and runs only in float16 / bfloat16 (`attention_backends` refuses
other settings before the model loads). The metadata reaches the device once per step,
through pinned memory without blocking.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.backends import import_kernel_module
from astrai_batch.engine.attention.kernels.interface import paged_view
from astrai_batch.engine.attention.kernels.paged_kv_metadata import PagedKVMetadata
from astrai_batch.engine.attention.step_arrays import to_device


class FlashAttnKernel:
    name = "flash-attn"

    def __init__(self, device: torch.device) -> None:
        self._varlen = import_kernel_module("flash-attn").flash_attn_varlen_func
        self._device = device
        self._step: tuple | None = None

    def begin_step(self, metadata: PagedKVMetadata) -> None:
        device = self._device
        self._step = (
            metadata.page_size,
            to_device(metadata.qo_indptr, device),
            to_device(metadata.cu_seqlens_k, device),
            to_device(metadata.block_table, device),
            metadata.max_q_len,
            metadata.max_kv_len,
        )

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        if self._step is None:
            raise RuntimeError("FlashAttnKernel.attend before begin_step")
        page_size, cu_q, cu_k, block_table, max_q, max_k = self._step
        return self._varlen(
            q.to(k_cache.dtype).contiguous(),
            paged_view(k_cache, page_size),
            paged_view(v_cache, page_size),
            cu_q,
            cu_k,
            max_q,
            max_k,
            dropout_p=0.0,
            softmax_scale=float(scale),
            causal=True,
            block_table=block_table,
        )
