"""The step's calls of torch's CPU flash kernel under invariant numerics (`flash_blocks`).

torch's CPU flash kernel splits a call's keys into blocks of `min(512, keys)` from position 0
and folds them in order with an online softmax; it splits queries into blocks of 32, 64 or
256 rows, each block's scores and probabilities x values one MKL GEMM. A query's result is
therefore the same in every call when:

Keys are cut into blocks of `rules.block` (B: 128, 64, 256 or 512, the first of those the
probe found invariant for the model here, fixed at engine start, never chosen by a step); a call
reads at most one block, so the kernel runs it as one of its own blocks. Then:

1. the key length is whole blocks of B and a *tail* from the probed set: the
   split is by position, never by the call; blocks past a query's own keys are fully
   masked, and a fully masked block changes nothing (its probabilities are exact zeros, its
   rescale factor exp(0) = 1, and the P x V GEMM adds exact zeros, the masked keys and
   values being finite). Within a block, masked keys add exact zeros to the sums too, but
   the BLAS sums a P x V GEMM's keys in chunks set by its length (MKL here: a last block of
   256 or 320 keys sums otherwise than one of 512), so only tail lengths whose rows equal
   the full block's are used (`flash_probe`: for B = 512, 64, 128, 192, 384, 448 and 512
   on AMD Zen);
2. every query block has a row count the BLAS treats like a large one: the call's query rows
   are padded with zero rows to a multiple of `ROW_MULTIPLE` (the last block's remainder is
   then 0 or at least 4; MKL computes the trailing rows of 1-3-row remainders with other
   micro-kernels);
3. masked keys get -inf from an additive mask, in every call the same code path.

`flash_probe` checks these on the engine's CPU at start.

A query whose keys fit one block (position < B) takes the kernel's output as it is: one call
per prefill chunk, one per class of decodes with the same key length. A longer query never
lets the kernel fold its blocks: each of its blocks is an element of its own (keys
[B b, B b + length)), whose output and log-sum-exp land in the step's merge slots, and
`flash_blocks.fold_blocks` folds them in block order, so a query's bits never depend on
which element computed a block. That lets decodes sharing a prefix's full blocks read them
once: such a block is one element whose query rows are every sharer's (the cascade's saving).
Elements with the same key length and query count form one call; query heads sharing a KV
head are folded into the query rows, (group member, token) order.

A query inside an image whose placeholders attend to each other (`step.key_limits`) sees keys
up to its image's last position instead of its own: its route, blocks and mask follow that
limit, a function of its sequence alone, as its position is (`engine.vision.image_spans`).

A windowed layer's plan (`window` W) masks keys at positions <= p - W as well (-inf, the
same additive mask: masked keys add exact zeros wherever they sit in a block) and leaves out
a query's blocks wholly before its window: such a block would have weight exp(-inf) = 0 in
the fold, so its absence gives the same bits. Every element still holds at least one key its
rows see (its own position, or the window's first key).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.flash_block_types import (
    FlashCall,
    FlashMerge,
    FlashRules,
    key_lengths,
    padded_rows,
)
from astrai_batch.engine.attention.flash_decode_plan import DecodeBlocks
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.step_arrays import StepArrays


class _Element(NamedTuple):
    rows: np.ndarray  # [t] packed rows
    positions: np.ndarray  # [t]
    limits: np.ndarray  # [t] the last key each row sees (its position, or its image's end)
    key_start: int
    keys: int
    table: np.ndarray  # the sequence's page table (zero-padded)
    slots: np.ndarray  # [t] output rows, or merge slots (query index * blocks + block)
    merged: bool


def plan_flash_step(
    step: StepArrays,
    page_size: int,
    rules: FlashRules,
    dtype: torch.dtype,
    staging: HostStaging,
    window: int | None = None,
    share: bool = True,
) -> tuple[list[FlashCall], FlashMerge | None]:
    """`share` False: no block is read once for several decodes (the cascade off)."""
    block = rules.block

    def tail(keys: int) -> int:
        return int(key_lengths(np.array([keys]), rules.tails, block)[0])

    last = step.context_start + step.num_tokens - 1
    blocks = int(last.max()) // block + 1 if len(last) else 1  # merge slots per query
    elements: list[_Element] = []
    merge_rows: list[np.ndarray] = []
    count = 0  # longer queries so far
    for c in np.flatnonzero(step.num_tokens > 1).tolist():
        n, start, table = int(step.num_tokens[c]), int(step.context_start[c]), step.page_tables[c]
        rows = step.token_start[c] + np.arange(n)
        positions = start + np.arange(n)
        # non-decreasing along the chunk, like positions: a route by limit is still a prefix
        limits = positions if step.key_limits is None else step.key_limits[rows]
        one = limits < block
        if one.any():
            keys = tail(int(limits[one].max()) + 1)
            elements.append(
                _Element(rows[one], positions[one], limits[one], 0, keys, table, rows[one], False)
            )
        if one.all():
            continue
        rows, positions, limits = rows[~one], positions[~one], limits[~one]
        merge_rows.append(rows)
        index = np.arange(count, count + len(rows))
        count += len(rows)
        floor = positions - window + 1 if window is not None else np.zeros_like(positions)
        for b in range(max(int(floor[0]), 0) // block, int(limits[-1]) // block + 1):
            has = (limits >= b * block) & (floor < (b + 1) * block)
            if not has.any():
                continue
            keys = tail(min(int(limits[has].max()) + 1 - b * block, block))
            slots = index[has] * blocks + b
            element = (rows[has], positions[has], limits[has], b * block, keys, table, slots)
            elements.append(_Element(*element, True))
    decodes = DecodeBlocks(rules.tails, block, blocks, page_size, window, share)
    d = step.decodes
    if len(d):
        positions = step.context_start[d]
        longer = positions >= block
        index = np.full(len(d), -1)
        index[longer] = np.arange(count, count + int(longer.sum()))
        count += int(longer.sum())
        merge_rows.append(step.token_start[d][longer])
        decodes.add(step.token_start[d], positions, step.page_tables[d], index)
    for b, rows, positions, slots, table in decodes.shared:
        elements.append(_Element(rows, positions, positions, b * block, block, table, slots, True))
    calls = _calls(elements, page_size, rules.group, dtype, staging, window)
    calls += decodes.calls(page_size, rules.group, dtype, staging)
    merge = None
    if count:
        rows = staging.array(np.concatenate(merge_rows).astype(np.int64))
        merge = FlashMerge(rows=rows, blocks=blocks)
    return calls, merge


def _calls(elements, page_size, group, dtype, staging, window) -> list[FlashCall]:
    """Elements with the same key length, query count and destination as one call each."""
    classes: dict[tuple[int, int, bool], list[_Element]] = {}
    for e in elements:
        classes.setdefault((e.keys, len(e.rows), e.merged), []).append(e)
    calls = []
    for (keys, tokens, merged), members in classes.items():
        query_rows = padded_rows(group * tokens)
        positions = np.stack([e.positions for e in members])  # [B, t]
        limits = np.stack([e.limits for e in members])
        starts = np.array([e.key_start for e in members])
        key_pos = starts[:, None, None] + np.arange(keys)[None, None, :]
        masked = key_pos > limits[:, :, None]
        if window is not None:
            masked |= key_pos <= positions[:, :, None] - window
        masked = torch.from_numpy(masked)  # [B, t, keys]
        b = len(members)
        if tokens == 1:
            mask = torch.zeros(b, 1, 1, keys, dtype=dtype)
            mask.view(b, keys).masked_fill_(masked.view(b, keys), float("-inf"))
        else:
            mask = torch.zeros(b, query_rows, keys, dtype=dtype)
            mask[:, : group * tokens].view(b, group, tokens, keys).masked_fill_(
                masked[:, None], float("-inf")
            )
            mask = mask.view(b, 1, query_rows, keys)
        slots = np.concatenate([e.slots for e in members])
        tables = np.stack([_pages(e.table, e.key_start, keys, page_size) for e in members])
        calls.append(
            FlashCall(
                token_index=staging.array(np.concatenate([e.rows for e in members])),
                elements=b,
                tokens=tokens,
                query_rows=query_rows,
                keys=keys,
                page_tables=staging.array(tables),
                mask=staging.tensor(mask),
                slots=staging.array(slots.astype(np.int64)),
                merged=merged,
            )
        )
    return calls


def _pages(table: np.ndarray, key_start: int, keys: int, page_size: int) -> np.ndarray:
    """The pages holding keys [key_start, key_start + keys), padded with page 0 (masked)."""
    first = key_start // page_size
    count = -(-keys // page_size)
    out = np.zeros(count, dtype=np.int64)
    own = table[first : first + count]
    out[: len(own)] = own
    return out
