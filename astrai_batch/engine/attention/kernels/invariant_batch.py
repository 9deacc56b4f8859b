"""A step as the invariant CUDA attention reads it (`invariant_triton`): built once per step.

Each query token needs only which page-table row is its sequence's and how many keys it
sees (its position + 1: the chunk's context and its own chunk up to itself). Both travel in
one pinned, non-blocking copy; the page tables in a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.step_arrays import StepArrays


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
    attend: Callable[..., torch.Tensor]  # `invariant_triton.invariant_attention`


def invariant_kernel_batch(
    step: StepArrays, pool, staging: HostStaging, attend: Callable[..., torch.Tensor]
) -> InvariantKernelBatch:
    """`pool`: the KV pool (its caches and page size)."""
    # the step packs each chunk's tokens contiguously, in chunk order (`step_buffers`)
    chunks = np.arange(len(step.num_tokens), dtype=np.int32)
    per_token = np.stack(
        [np.repeat(chunks, step.num_tokens), (step.positions + 1).astype(np.int32)]
    ).astype(np.int32)
    staged = staging.array(per_token)
    return InvariantKernelBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=pool.page_size,
        write_slots=staging.array(step.write_slots),
        longest_context=step.longest_context,
        tables=staging.array(step.page_tables.astype(np.int32)),
        token_table=staged[0],
        token_keys=staged[1],
        attend=attend,
    )
