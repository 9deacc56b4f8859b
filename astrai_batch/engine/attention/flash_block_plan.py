"""The step's calls of torch's CPU flash kernel under invariant numerics (`flash_blocks`).

torch's CPU flash kernel splits a call's keys into blocks of `min(512, keys)` from position 0
and folds them in order with an online softmax; it splits queries into blocks of 32, 64 or
256 rows, each block's scores and probabilities x values one MKL GEMM. A query's result is
therefore the same in every call when:

1. the key length is whole blocks of `KEY_BLOCK` (512) and a *tail* from the probed set: the
   split is by position, never by the call; blocks past a query's own keys are fully
   masked, and a fully masked block changes nothing (its probabilities are exact zeros, its
   rescale factor exp(0) = 1, and the P x V GEMM adds exact zeros, the masked keys and
   values being finite). Within a block, masked keys add exact zeros to the sums too, but
   the BLAS sums a P x V GEMM's keys in chunks set by its length (MKL here: a last block of
   256 or 320 keys sums otherwise than one of 512), so only tail lengths whose rows equal
   the 512-key ones are used (`flash_probe`: 64, 128, 192, 384, 448 and 512 here);
2. every query block has a row count the BLAS treats like a large one: the call's query rows
   are padded with zero rows to a multiple of `ROW_MULTIPLE` (the last block's remainder is
   then 0 or at least 4; MKL computes the trailing rows of 1-3-row remainders with other
   micro-kernels);
3. masked keys get -inf from an additive mask, in every call the same code path.

`flash_probe` checks these on the engine's CPU at start.

A query whose keys fit one block (position < 512) takes the kernel's output as it is: one call
per prefill chunk, one per class of decodes with the same key length. A longer query never
lets the kernel fold its blocks: each of its blocks is an element of its own (keys
[512 b, 512 b + length)), whose output and log-sum-exp land in the step's merge slots, and
`flash_blocks.fold_blocks` folds them in block order, so a query's bits never depend on
which element computed a block. That lets decodes sharing a prefix's full blocks read them
once: such a block is one element whose query rows are every sharer's (the cascade's saving).
Elements with the same key length and query count form one call; query heads sharing a KV
head are folded into the query rows, (group member, token) order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.step_arrays import StepArrays

KEY_BLOCK = 512  # torch's CPU flash kernel's key split (`kv_split_size`)
TAIL_STEP = 64  # candidate last-block lengths: multiples of this up to KEY_BLOCK
ROW_MULTIPLE = 4  # query rows per call padded to a multiple of this


class FlashRules(NamedTuple):
    """What the probe found: the kernel's invariant shapes for this model, here."""

    group: int  # query heads per KV head
    tails: tuple[int, ...]  # last-block key lengths with the full block's bits, ascending


class FlashCall(NamedTuple):
    """`elements` x `tokens` queries, each element with its own `keys` keys."""

    token_index: torch.Tensor  # [elements * tokens] packed-batch rows, element-major
    elements: int
    tokens: int
    query_rows: int  # group * tokens, padded up to a multiple of ROW_MULTIPLE
    keys: int  # whole KEY_BLOCKs and a probed tail (one block: elements of a longer query)
    page_tables: torch.Tensor  # [elements, pages covering `keys`], padded with page 0
    mask: torch.Tensor  # [elements, 1, query_rows or 1, keys]: 0, or -inf past the query
    slots: torch.Tensor  # [elements * tokens] output rows, or merge slots when `merged`
    merged: bool  # outputs go to the merge slots, with their log-sum-exp


class FlashMerge(NamedTuple):
    """The step's queries longer than one block: their per-block results, folded."""

    rows: torch.Tensor  # [M] packed-batch rows
    blocks: int  # slots per query: query i's block b is slot i * blocks + b


class FlashBlockBatch(NamedTuple):
    """What every layer needs; built once per step."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    write_slots: torch.Tensor  # [T]
    longest_context: int
    calls: list[FlashCall]
    merge: FlashMerge | None
    gatherer: PageGatherer


class _Element(NamedTuple):
    rows: np.ndarray  # [t] packed rows
    positions: np.ndarray  # [t]
    key_start: int
    keys: int
    table: np.ndarray  # the sequence's page table (zero-padded)
    slots: np.ndarray  # [t] output rows, or (merge index, block) pairs as [t, 2]
    merged: bool


def padded_rows(rows: int) -> int:
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def key_lengths(contexts: np.ndarray, tails: tuple[int, ...]) -> np.ndarray:
    """Keys a call reads for sequences of `contexts` tokens: whole blocks, then the shortest
    probed tail that holds the rest."""
    full = (contexts - 1) // KEY_BLOCK
    rest = contexts - full * KEY_BLOCK
    table = np.array(tails)
    return full * KEY_BLOCK + table[np.searchsorted(table, rest)]


def plan_flash_step(
    step: StepArrays, page_size: int, rules: FlashRules, dtype: torch.dtype, staging: HostStaging
) -> tuple[list[FlashCall], FlashMerge | None]:
    def tail(keys: int) -> int:
        return int(key_lengths(np.array([keys]), rules.tails)[0])

    elements: list[_Element] = []
    merge_rows: list[int] = []
    merge_blocks: list[int] = []
    shared: dict[tuple, list] = {}  # (block, its pages) -> [rows, positions, slots, table]
    for c in range(len(step.num_tokens)):
        n, start, table = int(step.num_tokens[c]), int(step.context_start[c]), step.page_tables[c]
        rows = step.token_start[c] + np.arange(n)
        positions = start + np.arange(n)
        one = positions < KEY_BLOCK
        if one.any():
            keys = tail(int(positions[one].max()) + 1)
            elements.append(_Element(rows[one], positions[one], 0, keys, table, rows[one], False))
        if one.all():
            continue
        rows, positions = rows[~one], positions[~one]
        first = len(merge_rows)
        merge_rows.extend(rows.tolist())
        merge_blocks.extend((positions // KEY_BLOCK + 1).tolist())
        index = np.arange(first, first + len(rows))
        for b in range(int(positions[-1]) // KEY_BLOCK + 1):
            has = positions >= b * KEY_BLOCK
            last = int(positions[has].max()) + 1 - b * KEY_BLOCK
            slots = np.stack([index[has], np.full(int(has.sum()), b)], axis=1)
            if n == 1 and last > KEY_BLOCK:  # a decode's full block: shared if its pages are
                per_block = KEY_BLOCK // page_size
                pages = tuple(table[b * per_block : (b + 1) * per_block].tolist())
                entry = shared.setdefault((b, pages), [[], [], [], table])
                entry[0].append(rows[0])
                entry[1].append(positions[0])
                entry[2].append(slots[0])
                continue
            keys = tail(min(last, KEY_BLOCK))
            elements.append(
                _Element(rows[has], positions[has], b * KEY_BLOCK, keys, table, slots, True)
            )
    for (b, _), (rows, positions, slots, table) in shared.items():
        element = _Element(
            np.array(rows),
            np.array(positions),
            b * KEY_BLOCK,
            KEY_BLOCK,
            table,
            np.array(slots),
            True,
        )
        elements.append(element)
    merge = None
    blocks = max(merge_blocks, default=0)
    if merge_rows:
        rows = staging.array(np.array(merge_rows, dtype=np.int64))
        merge = FlashMerge(rows=rows, blocks=blocks)
    return _calls(elements, blocks, page_size, rules.group, dtype, staging), merge


def _calls(elements, blocks, page_size, group, dtype, staging) -> list[FlashCall]:
    """Elements with the same key length, query count and destination as one call each."""
    classes: dict[tuple[int, int, bool], list[_Element]] = {}
    for e in elements:
        classes.setdefault((e.keys, len(e.rows), e.merged), []).append(e)
    calls = []
    for (keys, tokens, merged), members in classes.items():
        query_rows = padded_rows(group * tokens)
        positions = np.stack([e.positions for e in members])  # [B, t]
        starts = np.array([e.key_start for e in members])
        key_pos = starts[:, None, None] + np.arange(keys)[None, None, :]
        masked = torch.from_numpy(key_pos > positions[:, :, None])  # [B, t, keys]
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
        if merged:
            pairs = np.concatenate([e.slots for e in members])
            slots = pairs[:, 0] * blocks + pairs[:, 1]
        else:
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
