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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from astrai_batch.engine.cascade import partition_decodes

BLOCK_TARGET_TOKENS = 64  # a block is the smallest whole number of pages holding this many
# A prefill chunk's rows are split into runs of this many blocks of positions, each reading
# only the blocks up to its own last row: causal attention skips most of the masked half.
RUN_SEGMENT_BLOCKS = 4


def block_tokens_for(page_size: int) -> int:
    return page_size * max(1, -(-BLOCK_TARGET_TOKENS // page_size))


@dataclass(frozen=True)
class BlockRun:
    """Query rows that all read blocks [0, num_blocks) of the same pages."""

    rows: torch.Tensor  # [n] rows of the packed batch
    page_table: torch.Tensor  # [1, num_blocks * pages_per_block], padded with page 0
    num_blocks: int


@dataclass(frozen=True)
class BlockBatch:
    """What every layer needs for batch-invariant attention; built once per step."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    block_tokens: int
    write_slots: torch.Tensor  # [T]
    key_valid: torch.Tensor  # [T, num_blocks, 1, 1, block_tokens] bool: key position <= query's
    num_blocks: int  # the step's most blocks of one query
    runs: list[BlockRun]
    unit_rows: torch.Tensor  # [U] query row of each private unit
    unit_blocks: torch.Tensor  # [U] block index of each private unit
    unit_tables: torch.Tensor  # [U, pages_per_block] the unit's pages, padded with page 0
    gatherer: object  # the runner's PageGatherer


@dataclass(frozen=True)
class QuerySpan:
    """One scheduled chunk as the plan sees it."""

    row: int  # first row in the packed batch
    start: int  # position of the first token
    length: int
    pages: Sequence[int]


def plan_blocks(
    spans: Sequence[QuerySpan], page_size: int, use_cascade: bool, device: torch.device
) -> tuple[list[BlockRun], torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Runs and private units covering blocks 0..last of every query row; and the block count.

    Every (row, block <= row's last) pair is covered exactly once, by a run or by a unit.
    """
    block = block_tokens_for(page_size)
    per_block = block // page_size
    runs: list[BlockRun] = []
    decodes = [s for s in spans if s.length == 1]
    segment = block * RUN_SEGMENT_BLOCKS
    for span in spans:
        if span.length == 1:
            continue
        end = span.start + span.length
        first = span.start
        while first < end:
            last = min(end, (first // segment + 1) * segment)  # exclusive
            blocks = (last - 1) // block + 1
            rows = torch.arange(span.row + first - span.start, span.row + last - span.start)
            table = _table(span.pages, blocks * per_block, device)
            runs.append(BlockRun(rows.to(device), table, blocks))
            first = last
    first_private = [0] * len(decodes)
    if use_cascade and len(decodes) > 1:
        lengths = [d.start + 1 for d in decodes]
        tables = [list(d.pages) for d in decodes]
        for members, shared_pages in partition_decodes(tables, lengths, page_size).groups:
            shared = shared_pages // per_block
            if shared == 0:
                continue
            rows = torch.tensor([decodes[i].row for i in members], device=device)
            runs.append(BlockRun(rows, _table(decodes[members[0]].pages, shared * per_block, device), shared))
            for i in members:
                first_private[i] = shared
    unit_rows: list[int] = []
    unit_blocks: list[int] = []
    unit_pages: list[list[int]] = []
    for first, span in zip(first_private, decodes, strict=True):
        for b in range(first, span.start // block + 1):
            pages = list(span.pages[b * per_block : (b + 1) * per_block])
            unit_rows.append(span.row)
            unit_blocks.append(b)
            unit_pages.append(pages + [0] * (per_block - len(pages)))
    most = max((s.start + s.length - 1) // block + 1 for s in spans)
    return (
        runs,
        torch.tensor(unit_rows, dtype=torch.long, device=device),
        torch.tensor(unit_blocks, dtype=torch.long, device=device),
        torch.tensor(unit_pages, dtype=torch.long, device=device).view(len(unit_rows), per_block),
        most,
    )


def key_valid_mask(
    positions: torch.Tensor, num_blocks: int, block_tokens: int
) -> torch.Tensor:
    """[T, num_blocks, 1, 1, block_tokens] bool: block b's key j is at or before the query."""
    keys = torch.arange(num_blocks * block_tokens, device=positions.device)
    valid = keys.unsqueeze(0) <= positions.unsqueeze(1)
    return valid.view(-1, num_blocks, 1, 1, block_tokens)


def _table(pages: Sequence[int], count: int, device: torch.device) -> torch.Tensor:
    table = [int(p) for p in pages[:count]]
    table += [0] * (count - len(table))
    return torch.tensor(table, dtype=torch.long, device=device).unsqueeze(0)
