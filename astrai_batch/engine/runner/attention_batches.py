"""A step's arrays as the batch its attention path reads: invariant numerics' flash-kernel
calls (CPU), Triton kernel batch (CUDA) or block-ordered plan, a paged kernel's batch, or the
step-shaped path's prefill spans, padded decode group and cascade (decodes that share prefix
pages). The runner picks the path; these build."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.block_plan import (
    BlockBatch,
    DecodeRows,
    QuerySpan,
    block_tokens_for,
    plan_blocks,
)
from astrai_batch.engine.attention.cascade import DecodePartition, partition_rows
from astrai_batch.engine.attention.cascade_plan import CascadeBatch, plan_cascade
from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.kernels.interface import KernelBatch, PagedKernel
from astrai_batch.engine.attention.kernels.invariant_batch import InvariantKernelBatch
from astrai_batch.engine.attention.kernels.paged_kv_metadata import paged_kv_metadata
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.paged_attention import (
    AttentionBatch,
    DecodeGroup,
    PrefillSpan,
    offset_causal_mask,
)
from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.numerics.blas_rows import RowScheme


def block_batch(
    step: StepArrays,
    pool: KVPool,
    staging: HostStaging,
    gatherer: PageGatherer,
    *,
    use_cascade: bool,
    gemm_rows: RowScheme,
    window: int | None = None,
) -> BlockBatch:
    d = step.decodes
    if len(d) == len(step.num_tokens):  # decode-only: every chunk's row, as they are
        spans = []
        decodes = DecodeRows(step.token_start, step.context_start, step.page_tables)
    else:
        spans = [
            QuerySpan(
                int(step.token_start[i]),
                int(step.context_start[i]),
                int(step.num_tokens[i]),
                step.page_tables[i],  # zero-padded past its pages, as the plan pads
                _limits(step, i),
            )
            for i in np.flatnonzero(step.num_tokens > 1).tolist()
        ]
        decodes = DecodeRows(step.token_start[d], step.context_start[d], step.page_tables[d])
    runs, units = plan_blocks(spans, pool.page_size, use_cascade, staging, decodes, window)
    return BlockBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=pool.page_size,
        block_tokens=block_tokens_for(pool.page_size),
        write_slots=staging.array(step.write_slots),
        longest_context=step.longest_context,
        runs=runs,
        units=units,
        gatherer=gatherer,
        gemm_rows=gemm_rows,
        window=window,
    )


def flash_block_batch(
    step: StepArrays,
    pool: KVPool,
    staging: HostStaging,
    gatherer: PageGatherer,
    rules: FlashRules,
    window: int | None = None,
    share: bool = True,
) -> FlashBlockBatch:
    dtype = pool.key_cache[0].dtype
    calls, merge = plan_flash_step(step, pool.page_size, rules, dtype, staging, window, share)
    return FlashBlockBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=pool.page_size,
        write_slots=staging.array(step.write_slots),
        longest_context=step.longest_context,
        calls=calls,
        merge=merge,
        gatherer=gatherer,
        window=window,
        row_memo={},
    )


def invariant_kernel_batch(
    step: StepArrays, pool: KVPool, staging: HostStaging, attend: Callable[..., torch.Tensor]
) -> InvariantKernelBatch:
    # the step packs each chunk's tokens contiguously, in chunk order (`step_buffers`); each
    # token's chunk and key count travel in one copy, the page tables in a second
    chunks = np.arange(len(step.num_tokens), dtype=np.int32)
    rows = [np.repeat(chunks, step.num_tokens), (step.positions + 1).astype(np.int32)]
    if step.key_limits is not None:  # an image's tokens see the whole image (the CPU kernel)
        rows.append((step.key_limits + 1).astype(np.int32))
    per_token = staging.array(np.stack(rows))
    return InvariantKernelBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=pool.page_size,
        write_slots=staging.array(step.write_slots),
        longest_context=step.longest_context,
        tables=staging.array(step.page_tables.astype(np.int32)),
        token_table=per_token[0],
        token_keys=per_token[1],
        attend=attend,
        token_key_ends=per_token[2] if step.key_limits is not None else None,
    )


def kernel_batch(
    step: StepArrays, pool: KVPool, staging: HostStaging, kernel: PagedKernel
) -> KernelBatch:
    kernel.begin_step(paged_kv_metadata(step, pool.page_size))
    return KernelBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=pool.page_size,
        write_slots=staging.array(step.write_slots),
        longest_context=step.longest_context,
        kernel=kernel,
    )


def step_shaped_batch(
    step: StepArrays,
    pool: KVPool,
    staging: HostStaging,
    gatherer: PageGatherer,
    *,
    use_cascade: bool,
) -> AttentionBatch:
    device = pool.key_cache[0].device
    page = pool.page_size
    stage = staging.array
    prefills: list[PrefillSpan] = []
    for i in np.flatnonzero(step.num_tokens > 1).tolist():
        row, n = int(step.token_start[i]), int(step.num_tokens[i])
        start = int(step.context_start[i])
        limits = _limits(step, i)
        if start == 0 and limits is None:
            prefills.append(PrefillSpan(row, row + n, 0, None, None))
        else:
            needed = -(-(start + n) // page)
            table = stage(step.page_tables[i, :needed])
            if limits is None:
                mask = offset_causal_mask(n, start + n, device)
            else:  # keys up to each query's limit (an image's placeholders see each other)
                mask = staging.tensor(torch.from_numpy(np.arange(start + n) <= limits[:, None]))
            prefills.append(PrefillSpan(row, row + n, start, table, mask))
    decode, cascade = _decode_groups(step, page, staging, use_cascade)
    return AttentionBatch(
        key_cache=pool.key_cache,
        value_cache=pool.value_cache,
        page_size=page,
        write_slots=stage(step.write_slots),
        longest_context=step.longest_context,
        decode=decode,
        cascade=cascade,
        prefills=prefills,
        gatherer=gatherer,
    )


def _limits(step: StepArrays, chunk: int) -> np.ndarray | None:
    """The chunk's queries' last visible keys, where some see past their own position."""
    if step.key_limits is None:
        return None
    row, n = int(step.token_start[chunk]), int(step.num_tokens[chunk])
    limits = step.key_limits[row : row + n]
    return None if (limits == step.positions[row : row + n]).all() else limits


def _decode_groups(
    step: StepArrays, page: int, staging: HostStaging, use_cascade: bool
) -> tuple[DecodeGroup | None, CascadeBatch | None]:
    """Decodes sharing prefix pages go to the cascade batch; the rest one padded group."""
    decodes = step.decodes
    if len(decodes) == 0:
        return None, None
    stage = staging.array
    tables = step.page_tables[decodes]
    lengths = step.lengths[decodes]
    token_rows = step.token_start[decodes]
    if use_cascade:
        partition = partition_rows(tables, lengths, page)
    else:
        partition = DecodePartition(groups=[], rest=list(range(len(decodes))))
    cascade = None
    if partition.groups:
        needed = step.pages_needed(page)[decodes]
        exact = [tables[i, : needed[i]] for i in range(len(decodes))]
        cascade = plan_cascade(
            partition.groups, token_rows.tolist(), exact, lengths.tolist(), page, staging
        )
    if not partition.rest:
        return None, cascade
    rest = np.asarray(partition.rest, dtype=np.int64)
    rest_lengths = lengths[rest]
    width = int(-(-rest_lengths.max() // page))
    key_mask = np.arange(width * page) < rest_lengths[:, None]
    decode = DecodeGroup(
        token_index=stage(token_rows[rest]),
        page_tables=stage(tables[rest, :width]),
        key_mask=stage(key_mask).view(len(rest), 1, 1, -1),
    )
    return decode, cascade
