"""The flash-kernel attention's constants and step types (`flash_block_plan` says why).

Kept apart so the prefill and decode planners and the attention share them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.page_gather import PageGatherer

KERNEL_BLOCK = 512  # torch's CPU flash kernel's own key split (`kv_split_size`)
# the key blocks the probe judges, preferred first: a call never reads more than one block,
# so each is a single block of the kernel's. A shorter block lets decodes share a shorter
# prefix (a block whose pages several decodes share is read once for all of them); a longer
# one costs fewer kernel elements and fold steps per query, which is what a decode's
# attention pays for most (each element x KV head is one small kernel task). 128 keys was the
# best compromise measured (float32 decode steps over shared prefixes of 96 to 4,000 tokens,
# `scripts/bench_flash_blocks.py`, docs/numerics-cost.md section 5): never the slowest of
# 64/128/256, where 64 was the slowest from 288 tokens up and 256 the slowest at 96-640.
BLOCK_CANDIDATES = (128, 64, 256, KERNEL_BLOCK)


def block_candidates(dtype: torch.dtype) -> tuple[int, ...]:
    """The blocks the probe may pick for `dtype`. Below float32 only the kernel's own: the
    kernel returns a block's output in the query's dtype, so each extra block of a query
    adds a rounding (to 8 bits of mantissa in bfloat16) before the fold, where transformers'
    one call over the whole context folds the kernel's 512-key splits in float32; that drift
    left granite's and olmo2's bfloat16 greedy tokens in 3 of 7 rows with 64-key blocks.
    In float32 the rounding is the fold's own order of sums, within the tests' agreement."""
    if dtype.is_floating_point and torch.finfo(dtype).bits >= 32:
        return BLOCK_CANDIDATES
    return (KERNEL_BLOCK,)


TAIL_STEP = 64  # candidate last-block lengths: multiples of this up to the block
ROW_MULTIPLE = 4  # query rows per call padded to a multiple of this


class FlashRules(NamedTuple):
    """What the probe found: the kernel's invariant shapes for this model, here."""

    group: int  # query heads per KV head
    tails: tuple[int, ...]  # last-block key lengths with the full block's bits, ascending
    block: int = KERNEL_BLOCK  # keys per block: fixed for the model and machine, never by step


class FlashCall(NamedTuple):
    """`elements` x `tokens` queries, each element with its own `keys` keys."""

    token_index: torch.Tensor  # [elements * tokens] packed-batch rows, element-major
    elements: int
    tokens: int
    query_rows: int  # group * tokens, padded up to a multiple of ROW_MULTIPLE
    keys: int  # a probed tail of at most one block (a longer query: one element per block)
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
    window: int | None = None  # the sliding window this plan applies (None: full attention)
    # the step's head-major row indexes (`PageGatherer.gather_heads`), built by its first
    # layer and read by the others; None: each layer builds its own
    row_memo: dict | None = None


def padded_rows(rows: int) -> int:
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def key_lengths(contexts: np.ndarray, tails: tuple[int, ...], block: int) -> np.ndarray:
    """Keys a call reads for sequences of `contexts` tokens: whole `block`s, then the
    shortest probed tail that holds the rest."""
    full = (contexts - 1) // block
    rest = contexts - full * block
    table = np.array(tails)
    return full * block + table[np.searchsorted(table, rest)]
