"""The step's decodes as flash-kernel calls, in array operations (`flash_block_plan` says
which elements a query needs). A step can hold hundreds of decodes: a Python object per
decode and block cost more host time than the model's forward on small models, so here the
elements of one query token are arrays, grouped into calls by key length, and only the
blocks several decodes share become elements of their own.
"""

from __future__ import annotations

import numpy as np
import torch

from astrai_batch.engine.attention.flash_block_types import (
    FlashCall,
    key_lengths,
    padded_rows,
)
from astrai_batch.engine.attention.host_staging import HostStaging


class DecodeBlocks:
    """One-token elements of a step's decodes: the ones that take the kernel's output as it
    is (one block), and every block of the longer ones (merge slots)."""

    def __init__(
        self,
        tails: tuple[int, ...],
        block: int,
        blocks: int,
        page_size: int,
        window: int | None = None,
        share: bool = True,
    ) -> None:
        self.tails = tails
        # read a block several decodes share once for all (the cascade); off, each decode
        # reads its own copy, as when their pages differ (the memory plan's worst step)
        self.share = share
        self.block = block  # keys per block (`FlashRules.block`)
        self.window = window  # a windowed layer's: keys <= position - window are masked
        self.per_block = block // page_size  # pages per key block
        self.blocks = blocks  # merge slots per longer query
        self.parts: list[tuple] = []  # (rows, positions, key starts, keys, tables, slots, merged)
        # a block whose pages several decodes share: (block, rows, positions, slots, table)
        self.shared: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(
        self, rows: np.ndarray, positions: np.ndarray, tables: np.ndarray, merge_index: np.ndarray
    ) -> None:
        """Decodes at `positions`; `merge_index[i]` is decode i's merge query (or -1)."""
        block = self.block
        one = positions < block
        if one.any():
            keys = key_lengths(positions[one] + 1, self.tails, block)
            zero = np.zeros(int(one.sum()), dtype=np.int64)
            self.parts.append(
                (rows[one], positions[one], zero, keys, tables[one], rows[one], False)
            )
        if one.all():
            return
        rows, positions, tables = rows[~one], positions[~one], tables[~one]
        index = merge_index[~one]
        last = positions // block  # each decode's last block: its tail
        starts = last * block
        keys = key_lengths(positions + 1 - starts, self.tails, block)
        self.parts.append((rows, positions, starts, keys, tables, index * self.blocks + last, True))
        # full blocks first .. last - 1 (first: 0, or the window's first block), one
        # (decode, block) pair each
        first = np.zeros_like(last)
        if self.window is not None:
            first = np.minimum(np.maximum(positions - self.window + 1, 0) // block, last)
        counts = last - first
        owner = np.repeat(np.arange(len(rows)), counts)
        block_of = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        block_of += first[owner]
        if not len(owner):
            return
        per_block = self.per_block
        columns = block_of[:, None] * per_block + np.arange(per_block)[None, :]
        owned = tables[owner]
        pages = np.take_along_axis(owned, columns, axis=1)
        group, sizes = _same_pages(block_of, pages)
        alone = sizes[group] == 1 if self.share else np.ones(len(group), dtype=bool)
        slots = index[owner] * self.blocks + block_of
        self.parts.append(
            (
                rows[owner][alone],
                positions[owner][alone],
                block_of[alone] * block,
                np.full(int(alone.sum()), block),
                owned[alone],
                slots[alone],
                True,
            )
        )
        for g in np.unique(group[~alone]).tolist():
            members = np.flatnonzero(group == g)
            first = owner[members[0]]
            self.shared.append(
                (
                    int(block_of[members[0]]),
                    rows[owner[members]],
                    positions[owner[members]],
                    slots[members],
                    tables[first],
                )
            )

    def calls(
        self, page_size: int, group: int, dtype: torch.dtype, staging: HostStaging
    ) -> list[FlashCall]:
        """One call per (key length, destination) over every part added."""
        if not self.parts:
            return []
        fields = list(zip(*self.parts, strict=True))
        rows, positions, starts, keys = (np.concatenate(f) for f in fields[:4])
        width = max(t.shape[1] for t in fields[4])
        tables = np.concatenate([_widen(t, width) for t in fields[4]])
        slots = np.concatenate(fields[5])
        merged = np.concatenate(
            [np.full(len(r), m) for r, m in zip(fields[0], fields[6], strict=True)]
        )
        calls = []
        for key_count in np.unique(keys).tolist():
            for flag in (False, True):
                sel = (keys == key_count) & (merged == flag)
                if sel.any():
                    calls.append(
                        one_token_call(
                            rows[sel],
                            positions[sel],
                            starts[sel],
                            key_count,
                            tables[sel],
                            slots[sel],
                            flag,
                            page_size,
                            group,
                            dtype,
                            staging,
                            self.window,
                        )
                    )
        return calls


def one_token_call(
    rows, positions, starts, keys, tables, slots, merged, page_size, group, dtype, staging, window
) -> FlashCall:
    """Elements of one query token each, reading keys [starts, starts + keys)."""
    b = len(rows)
    masked = np.arange(keys)[None, :] > (positions - starts)[:, None]
    if window is not None:
        masked |= np.arange(keys)[None, :] <= (positions - starts - window)[:, None]
    mask = torch.zeros(b, 1, 1, keys, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(masked).view(b, 1, 1, keys), float("-inf"))
    columns = starts[:, None] // page_size + np.arange(-(-keys // page_size))[None, :]
    tables = _widen(tables, int(columns.max()) + 1)
    return FlashCall(
        token_index=staging.array(rows),
        elements=b,
        tokens=1,
        query_rows=padded_rows(group),
        keys=keys,
        page_tables=staging.array(np.take_along_axis(tables, columns, axis=1)),
        mask=staging.tensor(mask),
        slots=staging.array(slots.astype(np.int64)),
        merged=merged,
    )


def _same_pages(block: np.ndarray, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A group number per (decode, block) pair, equal for pairs reading the same pages, and
    each group's size. Pairs are first matched by (block, last page), one cheap 1-D pass
    (most steps share nothing); only candidates sharing one are compared page by page."""
    last = block * (int(pages.max()) + 1) + pages[:, -1]
    _, group, sizes = np.unique(last, return_inverse=True, return_counts=True)
    if (sizes == 1).all():
        return group, sizes
    _, group, sizes = np.unique(
        np.concatenate([block[:, None], pages], axis=1),
        axis=0,
        return_inverse=True,
        return_counts=True,
    )
    return group.reshape(-1), sizes


def _widen(tables: np.ndarray, width: int) -> np.ndarray:
    """Zero-padded (page 0: its keys are masked) to at least `width` columns."""
    if tables.shape[1] >= width:
        return tables
    out = np.zeros((len(tables), width), dtype=np.int64)
    out[:, : tables.shape[1]] = tables
    return out
