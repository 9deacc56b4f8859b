"""The step's metadata for batch-invariant attention: which query rows meet which key blocks.

Keys are cut into *blocks* of `block_tokens` consecutive positions (a whole number of pages,
aligned to position 0), and every query attends to blocks 0, 1, ... of its own sequence in that
order, whatever else the step holds. Two forms compute a (query, block) pair:

- a *run*: query rows that read the same physical blocks — the tokens of one prefill chunk,
  or decodes sharing prefix pages (the cascade) — score them in one GEMM per block run, so
  shared keys are read once;
- a *private unit*: one decode's own block, batched with every other such unit of the step.

Both forms put each (query, block) result in the same slot of the step's score and output
buffers, so the reduction that follows never knows which form computed it.

A query inside an image whose placeholders attend to each other (`QuerySpan.limits`) reads
the blocks up to its image's last position, keys after that masked: a prefill run covers its
rows' blocks up to their highest limit.

With a sliding window of W tokens (a windowed layer's plan), keys at positions <= p - W are
masked too and a query's blocks wholly before its window are not computed at all: such a
block would add exact zeros (its probabilities are exp(-inf) = 0), so leaving it out gives the
same bits. A run starts at the block of its first row's window; a decode's units at the block
of its own. Windowed plans keep no cascade: shared prefix blocks are mostly outside a long
sequence's window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.cascade import partition_rows
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO, RowScheme

BLOCK_TARGET_TOKENS = 64  # a block is the smallest whole number of pages holding this many
# A prefill chunk's rows are split into runs of this many blocks of positions, each reading
# only the blocks up to its own last row: causal attention skips most of the masked half.
RUN_SEGMENT_BLOCKS = 4


def block_tokens_for(page_size: int) -> int:
    return page_size * max(1, -(-BLOCK_TARGET_TOKENS // page_size))


class BlockRun(NamedTuple):
    """Query rows that all read blocks [first_block, first_block + num_blocks) of the same
    pages (first_block > 0 only in a windowed plan)."""

    rows: torch.Tensor  # [n] rows of the packed batch
    page_table: torch.Tensor  # [1, num_blocks * pages_per_block], padded with page 0
    num_blocks: int
    # [n, num_blocks, 1, 1, block] bool: key position > the row's (or outside its window);
    # None when no key is (the cascade's shared blocks all end before each member's token)
    key_masked: torch.Tensor | None
    first_block: int = 0


@dataclass(frozen=True)
class PrivateUnits:
    """Decode blocks read by one query each, sorted by block index."""

    rows: torch.Tensor  # [U] query row of each unit
    page_tables: torch.Tensor  # [U, pages_per_block] the unit's pages, padded with page 0
    # [U] the query's offset from the start of the unit's block: keys past it are masked
    # (block - 1 or more: none is). The mask itself is built on the device (`masked_keys`):
    # a number per unit travels instead of a block of booleans.
    key_limit: torch.Tensor
    block_starts: list[int]  # units of block b are [block_starts[b], block_starts[b + 1])
    # [U] a windowed plan's first key offset in the unit's block the query sees (keys before
    # it are outside its window; 0 or less: none is); None in a full-attention plan
    key_floor: torch.Tensor | None = None
    _masked: list[torch.Tensor] = field(default_factory=list, repr=False, compare=False)

    def masked_keys(self, block: int) -> torch.Tensor:
        """[U, 1, 1, block] bool, True for keys after the query (or before its window); built
        once per step, at the first layer that asks."""
        if not self._masked:
            keys = torch.arange(block, device=self.key_limit.device)
            masked = keys > self.key_limit[:, None]
            if self.key_floor is not None:
                masked |= keys < self.key_floor[:, None]
            self._masked.append(masked.view(-1, 1, 1, block))
        return self._masked[0]


class BlockBatch(NamedTuple):
    """What every layer needs for batch-invariant attention; built once per step (named
    tuples here: a frozen dataclass's field-by-field `__init__` is slow on the step's path)."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    block_tokens: int
    write_slots: torch.Tensor  # [T]
    longest_context: int  # the most tokens any sequence of the step has (context + new)
    runs: list[BlockRun]
    units: PrivateUnits
    gatherer: PageGatherer  # the runner's reusable gather buffers
    gemm_rows: RowScheme = ROWS_AT_LEAST_TWO  # how small GEMMs are padded (`blas_rows`)
    window: int | None = None  # the sliding window this plan applies (None: full attention)


@dataclass(frozen=True)
class QuerySpan:
    """One scheduled chunk as the plan sees it."""

    row: int  # first row in the packed batch
    start: int  # position of the first token
    length: int
    pages: Sequence[int]
    # [length] the last key each token sees where one sees past its own position (an image's
    # placeholders attending to each other, non-decreasing); None: causal
    limits: np.ndarray | None = None


@dataclass(frozen=True)
class DecodeRows:
    """The step's one-token chunks as arrays, the step buffers' form (no per-row objects)."""

    rows: np.ndarray  # [D] row of each decode in the packed batch
    positions: np.ndarray  # [D] position of its new token
    tables: np.ndarray  # [D, W] its page table, zero-padded, covering at least its position

    @classmethod
    def from_spans(cls, spans: Sequence[QuerySpan]) -> DecodeRows:
        width = max((len(s.pages) for s in spans), default=0)
        tables = np.zeros((len(spans), width), dtype=np.int64)
        for i, span in enumerate(spans):
            tables[i, : len(span.pages)] = span.pages
        return cls(
            rows=np.array([s.row for s in spans], dtype=np.int64),
            positions=np.array([s.start for s in spans], dtype=np.int64),
            tables=tables,
        )


def plan_blocks(
    spans: Sequence[QuerySpan],
    page_size: int,
    use_cascade: bool,
    staging: HostStaging,
    decodes: DecodeRows | None = None,
    window: int | None = None,
) -> tuple[list[BlockRun], PrivateUnits]:
    """Runs and private units covering blocks 0..last of every query row (with a `window`:
    from the block holding its window's first key).

    `spans` give the prefill chunks (and the decodes too when `decodes` is None; otherwise
    their one-token spans are ignored). Every (row, block <= row's last) pair is covered
    exactly once, by a run or by a unit, and a row's run blocks (when it has any) come before
    its unit blocks.
    """
    block = block_tokens_for(page_size)
    per_block = block // page_size
    runs = [
        run
        for span in spans
        if span.length > 1
        for run in _prefill_runs(span, block, per_block, staging, window)
    ]
    if decodes is None:
        decodes = DecodeRows.from_spans([s for s in spans if s.length == 1])
    first_private = np.zeros(len(decodes.rows), dtype=np.int64)
    if window is not None:
        first_private = np.maximum(decodes.positions - window + 1, 0) // block
        units = _private_units(decodes, first_private, block, per_block, staging)
        floor = decodes.positions - window + 1
        return runs, _with_floor(units, decodes, first_private, floor, block, staging)
    if use_cascade and len(decodes.rows) > 1:
        lengths = decodes.positions + 1
        for members, shared_pages in partition_rows(decodes.tables, lengths, page_size).groups:
            shared = shared_pages // per_block
            if shared == 0:
                continue
            members = np.asarray(members)
            # the shared blocks end before every member's own token: nothing to mask
            table = decodes.tables[members[0], None, : shared * per_block]
            rows = staging.array(decodes.rows[members])
            runs.append(BlockRun(rows, staging.array(table), shared, None))
            first_private[members] = shared
    return runs, _private_units(decodes, first_private, block, per_block, staging)


def _prefill_runs(
    span: QuerySpan, block: int, per_block: int, staging: HostStaging, window: int | None
):
    """A prefill chunk as runs of up to RUN_SEGMENT_BLOCKS blocks of its rows' positions."""
    segment = block * RUN_SEGMENT_BLOCKS
    end = span.start + span.length
    first = span.start
    while first < end:
        last = min(end, (first // segment + 1) * segment)  # exclusive
        positions = np.arange(first, last)
        limits = positions
        if span.limits is not None:
            limits = span.limits[first - span.start : last - span.start]
        blocks = int(limits[-1]) // block + 1
        start = 0 if window is None else max(first - window + 1, 0) // block
        rows = range(span.row + first - span.start, span.row + last - span.start)
        table = _table(span.pages[start * per_block :], (blocks - start) * per_block, staging)
        yield _run(rows, positions, limits, table, start, blocks - start, block, window, staging)
        first = last


def _run(rows, positions, limits, table, first_block, blocks, block, window, staging) -> BlockRun:
    keys = first_block * block + torch.arange(blocks * block)
    positions = torch.from_numpy(np.asarray(positions, dtype=np.int64))
    masked = keys.unsqueeze(0) > torch.from_numpy(np.asarray(limits, dtype=np.int64)).unsqueeze(1)
    if window is not None:
        masked |= keys.unsqueeze(0) <= positions.unsqueeze(1) - window
    return BlockRun(
        rows=staging.array(np.asarray(rows, dtype=np.int64)),
        page_table=table,
        num_blocks=blocks,
        key_masked=staging.tensor(masked.view(-1, blocks, 1, 1, block)),
        first_block=first_block,
    )


def _with_floor(units: PrivateUnits, decodes, first_private, floor, block, staging):
    """The units with each one's window floor: the query's first visible key, as an offset
    into the unit's block (units are sorted by block, decodes in step order within one)."""
    if not units.rows.numel():
        return units
    last = decodes.positions // block
    num_blocks = int(last.max()) + 1
    ladder = np.arange(num_blocks)[:, None]
    blocks, owner = np.nonzero((ladder >= first_private) & (ladder <= last))
    return PrivateUnits(
        rows=units.rows,
        page_tables=units.page_tables,
        key_limit=units.key_limit,
        block_starts=units.block_starts,
        key_floor=staging.array(floor[owner] - blocks * block),
    )


def _private_units(
    decodes: DecodeRows, first_private: np.ndarray, block: int, per_block: int, staging
) -> PrivateUnits:
    """One unit per (decode, block) from its first private block to the block of its
    position, sorted by block, decodes in step order within a block.

    Vectorized, in few numpy calls (each costs more than its arithmetic on a cache the
    forward has just swept): the units are the true cells of a [block, decode] coverage
    matrix, whose row-major `nonzero` is already that order.
    """
    positions = decodes.positions
    last = positions // block
    num_blocks = int(last.max()) + 1 if len(last) else 0
    ladder = np.arange(num_blocks)[:, None]
    covered = (ladder >= first_private) & (ladder <= last)
    blocks, owner = np.nonzero(covered)
    # [D, blocks, pages per block]: a unit's pages are one row of it
    tables = decodes.tables
    width = num_blocks * per_block
    if tables.shape[1] < width:
        padded = np.zeros((len(tables), width), dtype=np.int64)
        padded[:, : tables.shape[1]] = tables
        tables = padded
    elif tables.shape[1] % per_block:
        tables = tables[:, :width]
    if len(owner):
        pages = tables.reshape(len(tables), -1, per_block)[owner, blocks]
    else:
        pages = np.zeros((0, per_block), dtype=np.int64)
    starts = [0, *np.cumsum(covered.sum(axis=1)).tolist()]
    if not len(owner):  # a step without decodes copies nothing for them
        none = torch.empty(0, dtype=torch.long, device=staging.device)
        return PrivateUnits(none, none.view(0, per_block), none, starts)
    return PrivateUnits(
        rows=staging.array(decodes.rows[owner]),
        page_tables=staging.array(pages),
        key_limit=staging.array(positions[owner] - blocks * block),
        block_starts=starts,
    )


def _table(pages: Sequence[int], count: int, staging: HostStaging) -> torch.Tensor:
    table = [int(p) for p in pages[:count]]
    table += [0] * (count - len(table))
    return staging.values(table, torch.long).unsqueeze(0)
