"""The interface between the runner and a paged attention kernel (FlashInfer, flash-attn).

A kernel is owned by the runner and lives as long as it (workspace buffers, planned state).
Each step the runner hands it the step's `PagedKVMetadata` once (`begin_step`); every layer
then writes its new keys and values into the pool as the SDPA paths do and calls `attend`
once with every query of the step. A kernel reads the pool in place: the pool's per-layer
`[num_pages * page_size, kv_heads, head_dim]` tensor viewed as
`[num_pages, page_size, kv_heads, head_dim]` (NHD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from astrai_batch.engine.attention.kernels.paged_kv_metadata import PagedKVMetadata


class PagedKernel(Protocol):
    name: str

    def begin_step(self, metadata: PagedKVMetadata) -> None:
        """The step's metadata; called once per step, before the forward."""

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """q [T, Hq, D] (the step's queries, packed) -> [T, Hq, Dv]; once per layer."""


@dataclass(frozen=True)
class KernelBatch:
    """What every layer needs when a kernel computes the attention; built once per step."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    write_slots: torch.Tensor  # [T]
    longest_context: int
    kernel: PagedKernel


def paged_view(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """A pool tensor [slots, H, D] as pages [num_pages, page_size, H, D] (no copy)."""
    slots, heads, dim = cache.shape
    return cache.view(slots // page_size, page_size, heads, dim)
