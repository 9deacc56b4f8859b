"""The host side of a step's batch: token ids, positions, write slots, page tables, logit rows.

A step of 256 decoding sequences used to rebuild all of this from Python lists, a few small
tensors per sequence: about 15 ms of host work beside a forward of a few ms on a GPU. Here
the page tables live in one persistent matrix, a row per sequence, and a row is rewritten
only when the sequence's page table changed (the cache manager's `pages_version` stamp: a
new page every `page_size` tokens, a page switched to its cached twin, a re-admission).
Everything else a step needs is computed from that matrix and a few per-chunk numbers with
vectorized numpy, then handed over as tensors: on CPU without a copy, on CUDA through pinned
host memory with non-blocking copies, so building the step never waits for the device.

Invariants (`check_invariants`): a row holds its sequence's pages in `[0, count)` and zeros
after, so any slice of rows is already the zero-padded table the attention expects; every
key's row is distinct; free rows hold only zeros.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import numpy as np

from astrai_batch.engine.attention.step_arrays import StepArrays

ROW_GROWTH = 2


class StepBuffers:
    """The runner's persistent page-table matrix and the vectorized build of a step.

    A chunk names its sequence by `seq_key` (with the table's `pages_version`); a chunk
    without one gets a row for this step only. Rows of sequences absent from a step are
    released at its end (finished, preempted, or not scheduled), so the matrix never holds
    more rows than a step has chunks.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._tables = np.zeros((16, 16), dtype=np.int64)
        self._counts = np.zeros(16, dtype=np.int64)  # pages written in each row
        self._free: list[int] = list(range(15, -1, -1))
        self._rows: dict[Hashable, tuple[int, int]] = {}  # key -> (row, pages_version)
        self.rows_written = 0  # rows rewritten since creation (tests and benchmarks read it)

    def build(self, chunks: Sequence) -> StepArrays:
        """The step's arrays. Few numpy calls, Python lists where a pass over the chunks is
        needed anyway: each numpy call costs far more than its arithmetic here, on caches the
        forward has just swept."""
        page = self.page_size
        n = len(chunks)
        rows: list[int] = []
        starts: list[int] = []
        counts: list[int] = []
        wants: list[bool] = []
        previous = self._rows
        current: dict[Hashable, tuple[int, int]] = {}
        transient: list[int] = []
        for chunk in chunks:
            starts.append(chunk.start)
            counts.append(len(chunk.token_ids))
            wants.append(chunk.wants_logits)
            key = chunk.seq_key
            if key is None:
                row = self._take_row()
                transient.append(row)
                self._write(row, chunk.pages)
            else:
                held = previous.pop(key, None)
                version = chunk.pages_version
                if held is None:
                    if key in current:
                        raise ValueError(f"sequence {key!r} has two chunks in one step")
                    row = self._take_row()
                    self._write(row, chunk.pages)
                    held = (row, version)
                elif held[1] != version or version is None:
                    row = held[0]
                    self._write(row, chunk.pages)
                    held = (row, version)
                else:
                    row = held[0]
                current[key] = held
            rows.append(row)
        for row, _ in previous.values():
            self._release(row)
        self._rows = current
        if 0 in counts:
            raise ValueError("a scheduled chunk has no tokens")
        total = sum(counts)
        rows = np.array(rows, dtype=np.int64)
        starts = np.array(starts, dtype=np.int64)
        counts = np.array(counts, dtype=np.int64)
        decode_only = total == n  # one token per chunk: the common step
        token_start = np.arange(n) if decode_only else counts.cumsum() - counts
        ends = starts + counts
        held_pages = self._counts[rows]
        needed = (ends + (page - 1)) // page
        if (held_pages < needed).any():
            i = int(np.argmax(held_pages < needed))
            raise ValueError(
                f"chunk ends at token {int(ends[i])} but its {int(held_pages[i])} pages "
                f"hold {int(held_pages[i]) * page}"
            )
        if decode_only:
            token_ids = np.fromiter((c.token_ids[0] for c in chunks), np.int64, n)
            positions = starts
            token_rows = rows
        else:
            token_ids = np.fromiter(
                itertools.chain.from_iterable(c.token_ids for c in chunks), np.int64, total
            )
            owner = np.repeat(np.arange(n), counts)
            positions = np.arange(total) - token_start[owner] + starts[owner]
            token_rows = rows[owner]
        write_slots = self._tables[token_rows, positions // page] * page + positions % page
        longest = int(ends.max())
        width = (longest + page - 1) // page
        tables = self._tables[rows, :width]
        if (held_pages > needed).any():
            tables[np.arange(width) >= needed[:, None]] = 0  # pages held beyond what is needed
        last_rows = token_start + (counts - 1)
        for row in transient:
            self._release(row)
        return StepArrays(
            token_ids=token_ids,
            positions=positions,
            write_slots=write_slots,
            logit_rows=last_rows if all(wants) else last_rows[np.array(wants, dtype=bool)],
            token_start=token_start,
            num_tokens=counts,
            context_start=starts,
            page_tables=tables,
            decodes=token_start if decode_only else np.flatnonzero(counts == 1),
            longest_context=longest,
        )

    def check_invariants(self) -> None:
        rows = [row for row, _ in self._rows.values()]
        if len(set(rows)) != len(rows):
            raise RuntimeError("two sequences share a page-table row")
        if set(rows) & set(self._free):
            raise RuntimeError("a page-table row is both held and free")
        width = self._tables.shape[1]
        beyond = np.arange(width) >= self._counts[:, None]
        if self._tables[beyond].any():
            raise RuntimeError("a page-table row holds pages past its count")
        if self._counts[self._free].any():
            raise RuntimeError("a free page-table row holds pages")

    # -- rows ---------------------------------------------------------------------------

    def _take_row(self) -> int:
        if not self._free:
            old = self._tables.shape[0]
            self._tables = np.concatenate([self._tables, np.zeros_like(self._tables)])
            self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._free = list(range(ROW_GROWTH * old - 1, old - 1, -1))
        return self._free.pop()

    def _release(self, row: int) -> None:
        self._tables[row, : self._counts[row]] = 0
        self._counts[row] = 0
        self._free.append(row)

    def _write(self, row: int, pages: Sequence[int]) -> None:
        count = len(pages)
        if count > self._tables.shape[1]:
            width = max(count, ROW_GROWTH * self._tables.shape[1])
            grown = np.zeros((self._tables.shape[0], width), dtype=np.int64)
            grown[:, : self._tables.shape[1]] = self._tables
            self._tables = grown
        old = int(self._counts[row])
        self._tables[row, :count] = pages
        if old > count:
            self._tables[row, count:old] = 0
        self._counts[row] = count
        self.rows_written += 1
