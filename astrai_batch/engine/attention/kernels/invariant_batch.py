"""A step as the invariant attention kernels read it (`invariant_triton`, `invariant_cpu`),
built once per step by `runner.attention_batches.invariant_kernel_batch`.

Each query token needs only which page-table row is its sequence's and how many keys it
sees (its position + 1: the chunk's context and its own chunk up to itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InvariantKernelBatch:
    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    write_slots: torch.Tensor  # [T]
    longest_context: int
    tables: torch.Tensor  # [C, P] int32 each chunk's pages
    token_table: torch.Tensor  # [T] int32 the chunk (row of `tables`) of each query token
    token_keys: torch.Tensor  # [T] int32 keys each query token attends to
    attend: Callable[..., torch.Tensor]  # `invariant_triton`'s or `invariant_cpu`'s
    # [T] int32 keys each token sees where an image's tokens see the whole image (the CPU
    # kernel only); None: `token_keys`
    token_key_ends: torch.Tensor | None = None
