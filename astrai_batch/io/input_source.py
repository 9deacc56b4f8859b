"""The interface every input format offers the job runner."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from astrai_batch.io.filesystems import Location
from astrai_batch.io.fingerprint import files_fingerprint
from astrai_batch.io.row_ids import DuplicateIds
from astrai_batch.io.rows import SOURCE_SHAPES, InputRow, RowPlan


class InputSource(ABC):
    """A readable input: its row shapes, its rows (streamed), and an identity for resume.

    `path` is where the user's INPUT is (a file, or a directory of Parquet files), on any
    filesystem pyarrow reaches; `files` the files actually read, in reading order.
    `duplicates` lists the rows that repeat an earlier row's id, found when the input was
    opened (see `row_ids`).
    """

    def __init__(
        self,
        path: Location,
        input_format: str,
        plan: RowPlan,
        columns: Sequence[str],
        files: Sequence[Location],
        *,
        shape: str,
        duplicates: DuplicateIds,
    ) -> None:
        if shape not in SOURCE_SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SOURCE_SHAPES)}, got {shape!r}")
        self.path = path
        self.format = input_format
        self.plan = plan
        self.files = tuple(files)
        self.shape = shape
        self.duplicates = duplicates
        self._columns = tuple(columns)

    def columns(self) -> list[str]:
        """Column names of the (first) file; for JSONL, the keys of every object line, in
        the order they first appear."""
        return list(self._columns)

    def fingerprint(self) -> dict[str, Any]:
        """Identifies the input by content for resume checks (see `io.fingerprint`)."""
        return files_fingerprint(self.format, list(self.files))

    @abstractmethod
    def count_rows(self) -> int:
        """Number of rows `iter_rows()` yields (bad rows included)."""

    @abstractmethod
    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[InputRow]:
        """Rows `start` .. `stop - 1` (to the end when `stop` is None), streamed, exactly
        those: the rows before `start` are not parsed, and what the open scan recorded
        (Parquet footers, JSONL byte offsets) lets a reader begin near `start` instead of
        at the top, so chunks of one input can be read apart, each reading only its range.
        A source opened once pickles with what it recorded (to hand it to workers)."""

    @abstractmethod
    def kept_schema(self) -> pa.Schema:
        """The Arrow types of the keep columns, as the result file must store them."""

    def check_invariants(self) -> None:
        self.duplicates.check_invariants()
        if len(self.duplicates) and not self.plan.has_ids:
            raise ValueError("an input without ids cannot have duplicate ids")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.shown!r}, shape={self.shape!r})"


def check_start(start: int, stop: int | None = None) -> None:
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if stop is not None and stop < start:
        raise ValueError(f"stop must be >= start ({start}), got {stop}")
