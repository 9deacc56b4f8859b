"""The FlashInfer backend: one `BatchPrefillWithPagedKVCacheWrapper.run` per layer.

Every chunk of the step, prefill or decode (a decode is a chunk of one query row), is one
request of the wrapper; `plan` runs once per step, at the first layer (when the query's
heads, dtype and the model's scaling are known), from host int32 tensors that FlashInfer
copies to the device itself (no device synchronization); later layers must match what was
planned. Keys and values are read in place from the pool (NHD pages, keys and values as a
tuple). GQA is the kernel's own (`num_qo_heads` a multiple of `num_kv_heads`).

Shared-prefix (cascade) attention through `MultiLevelCascadeAttentionWrapper` is not used:
it wants every level's query segments to be contiguous ranges of the packed queries, while a
step packs chunks in scheduling order (a cascade group's decodes are interleaved with other
rows), so it would need a permutation of the queries and outputs in every layer and a second
set of metadata per step; and it could not be checked on a GPU here. The single kernel
still reads each page once per query tile from the pool, without any gather copy.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.backends import import_kernel_module
from astrai_batch.engine.attention.kernels.interface import paged_view
from astrai_batch.engine.attention.kernels.paged_kv_metadata import PagedKVMetadata

WORKSPACE_BYTES = 128 * 1024**2  # FlashInfer's documented size for its float workspace


class FlashInferKernel:
    name = "flashinfer"

    def __init__(self, device: torch.device) -> None:
        flashinfer = import_kernel_module("flashinfer")
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._metadata: PagedKVMetadata | None = None
        self._planned: tuple | None = None  # what this step was planned for

    def begin_step(self, metadata: PagedKVMetadata) -> None:
        self._metadata = metadata
        self._planned = None

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        meta = self._metadata
        if meta is None:
            raise RuntimeError("FlashInferKernel.attend before begin_step")
        _, q_heads, head_dim = q.shape
        kv_heads = k_cache.shape[1]
        shape = (q_heads, kv_heads, head_dim, v_cache.shape[-1], float(scale), k_cache.dtype)
        if self._planned is None:
            self._wrapper.plan(
                torch.from_numpy(meta.qo_indptr),
                torch.from_numpy(meta.kv_indptr),
                torch.from_numpy(meta.kv_indices),
                torch.from_numpy(meta.last_page_len),
                q_heads,
                kv_heads,
                head_dim,
                meta.page_size,
                causal=True,
                sm_scale=float(scale),
                q_data_type=k_cache.dtype,
                kv_data_type=k_cache.dtype,
            )
            self._planned = shape
        elif self._planned != shape:
            raise RuntimeError(
                f"FlashInfer was planned for (heads, kv heads, head dim, value dim, scale, "
                f"dtype) {self._planned} this step, but a layer has {shape}"
            )
        pages = (paged_view(k_cache, meta.page_size), paged_view(v_cache, meta.page_size))
        return self._wrapper.run(q.to(k_cache.dtype).contiguous(), pages)
