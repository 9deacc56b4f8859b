"""Row ids: where each row's id comes from, and which rows repeat an earlier row's id.

A row's id is the first non-null of its id fields (``--id-column``, else ``id``, else
``custom_id``). An input with no id field at all numbers its rows (id ``"0"``, ``"1"``, ...);
in an input that has one, a row without an id is an error row, never a made-up id that could
equal another row's.

Ids must be unique, and so must the ``custom_id`` s an OpenAI output echoes: a row's id and
its ``custom_id`` (when they differ) are both its identities, in one namespace, and a row
whose identity an earlier row already has is an error row
(``duplicate id 'x' (first at row 3)``; rows count from 0, as numbered ids do). Readers find
the repeats in one pass over the input before yielding any row (`IdScan`): 16 bytes of
blake2b digest, a row number and a kind per identity, never the id strings; what remains
afterwards is only the repeats (`DuplicateIds`). Whether a row is a repeat is so a function
of the input alone, the same on every read and after every resume.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from astrai_batch.io.rows import stringify_id

DIGEST_BYTES = 16
KIND_ID = 0
KIND_CUSTOM_ID = 1
KIND_NAMES = ("id", "custom_id")


def read_ids(record: Mapping[str, Any], id_fields: Sequence[str]) -> tuple[str | None, str | None]:
    """The record's id (as text) and its ``custom_id`` (when a string); None where absent."""
    raw = next((record[name] for name in id_fields if record.get(name) is not None), None)
    custom_id = record.get("custom_id")
    return (
        None if raw is None else stringify_id(raw),
        custom_id if isinstance(custom_id, str) else None,
    )


class DuplicateIds:
    """The rows that repeat an earlier row's identity: (row, kind, first row), sorted."""

    def __init__(self, rows: np.ndarray, kinds: np.ndarray, firsts: np.ndarray) -> None:
        self._rows, self._kinds, self._firsts = rows, kinds, firsts

    @classmethod
    def none(cls) -> DuplicateIds:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, np.zeros(0, dtype=np.uint8), empty)

    def __len__(self) -> int:
        return len(self._rows)

    def check_invariants(self) -> None:
        """Sorted by (row, kind), one entry per (row, kind), each first row before its row."""
        keys = self._rows * 2 + self._kinds
        if np.any(keys[1:] <= keys[:-1]):
            raise ValueError("duplicate entries are not sorted by row and kind, or repeat")
        if np.any(self._firsts >= self._rows) or np.any(self._firsts < 0):
            raise ValueError("a duplicate's first row is not an earlier row")

    def first_rows(self, index: int) -> tuple[int | None, int | None]:
        """For row `index`: the first row with its id, and with its custom_id, when earlier."""
        found: list[int | None] = [None, None]
        if len(self._rows):
            start, stop = np.searchsorted(self._rows, [index, index + 1])
            for position in range(int(start), int(stop)):
                found[int(self._kinds[position])] = int(self._firsts[position])
        return found[0], found[1]


class IdScan:
    """Collects every row's identities in row order; `duplicates` finds the repeats."""

    def __init__(self) -> None:
        self._digests = bytearray()
        self._rows = array("q")
        self._kinds = bytearray()

    def add(self, index: int, row_id: str | None, custom_id: str | None) -> None:
        if row_id is not None:
            self._add(index, KIND_ID, row_id)
        if custom_id is not None and custom_id != row_id:
            self._add(index, KIND_CUSTOM_ID, custom_id)

    def _add(self, index: int, kind: int, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        self._digests += hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()
        self._rows.append(index)
        self._kinds.append(kind)

    def duplicates(self) -> DuplicateIds:
        count = len(self._rows)
        if count == 0:
            return DuplicateIds.none()
        halves = np.frombuffer(self._digests, dtype=np.uint64).reshape(count, 2)
        rows = np.frombuffer(self._rows, dtype=np.int64)
        kinds = np.frombuffer(self._kinds, dtype=np.uint8)
        # lexsort is stable: equal digests stay in the order they were added, row order, so
        # the first of each run of equal digests is the first row with that identity.
        order = np.lexsort((halves[:, 1], halves[:, 0]))
        ordered = halves[order]
        starts = np.ones(count, dtype=bool)
        starts[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
        run_start = np.maximum.accumulate(np.where(starts, np.arange(count), 0))
        repeats = order[~starts]
        firsts = rows[order[run_start[~starts]]]
        by_row = np.lexsort((kinds[repeats], rows[repeats]))
        return DuplicateIds(rows[repeats][by_row], kinds[repeats][by_row], firsts[by_row])


@dataclass(frozen=True)
class RowIdentity:
    """A row's id and custom_id after the checks, and the error when one failed."""

    id: str | None
    custom_id: str | None
    error: str | None = None


def row_identity(
    record: Mapping[str, Any],
    index: int,
    *,
    id_fields: Sequence[str],
    has_ids: bool,
    duplicates: DuplicateIds,
    missing_name: str,
) -> RowIdentity:
    """The identity of row `index`; `missing_name` is the field an absent id is reported as."""
    if not has_ids:
        return RowIdentity(str(index), None)
    row_id, custom_id = read_ids(record, id_fields)
    first_id, first_custom = duplicates.first_rows(index)
    if first_custom is not None or custom_id == row_id:
        custom_id = None if first_custom is not None or first_id is not None else custom_id
    if row_id is None:
        return RowIdentity(None, custom_id, f"{missing_name} is missing")
    if first_id is not None:
        return RowIdentity(None, custom_id, _duplicate("id", row_id, first_id))
    if first_custom is not None:
        repeated = record["custom_id"]
        return RowIdentity(row_id, None, _duplicate("custom_id", repeated, first_custom))
    return RowIdentity(row_id, custom_id)


def _duplicate(kind: str, text: str, first: int) -> str:
    # JSON escapes keep the message on one line whatever the id holds.
    shown = json.dumps(text, ensure_ascii=False)[1:-1]
    return f"duplicate {kind} '{shown}' (first at row {first})"
