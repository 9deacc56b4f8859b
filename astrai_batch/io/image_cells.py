"""Where a Parquet (or Arrow) cell's image bytes are stored, and reading them when needed.

A row keeps an `ImageCell` (file, row group, row, column, list position) instead of its
image's encoded bytes, from the reader on, so what a window holds does not grow with the
images' size: the bytes are read when the window is prepared and again when the row's
request enters the engine. Parquet has
no random access inside a row group, so `CellReader` reads the cell's whole column of its row
group (only that column) and keeps the last `keep` such columns, so rows of one row group run
one after another (input order, or a prefix order over few groups) read it once. The cost is
read amplification where the planned order jumps between more row groups than it keeps: at
worst one row group's column read per image.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.errors import ImageError
from astrai_batch.io.filesystems import Location

DEFAULT_KEPT_GROUPS = 2  # row groups' image columns a reader keeps


@dataclass(frozen=True, slots=True)
class CellOrigin:
    """One stored record: `row` (0-based) of row group (an Arrow file's record batch)
    `row_group` in `file`; `file_format` "parquet" or "arrow"."""

    file: Location
    file_format: str
    row_group: int
    row: int

    def cell(self, column: str, item: int | None, size: int) -> ImageCell:
        return ImageCell(self, column, item, size)


@dataclass(frozen=True, slots=True)
class ImageCell:
    """An image's bytes as stored: the cell of `column` in the record at `origin`; `item`
    is the position in a list cell (None: the cell itself); `size` the bytes' length when
    the reader saw them. A cell holding Hugging Face's ``{bytes, path}`` struct is read at
    its ``bytes`` field."""

    origin: CellOrigin
    column: str
    item: int | None = None
    size: int = 0

    @property
    def shown(self) -> str:
        origin = self.origin
        where = self.column if self.item is None else f"{self.column}[{self.item}]"
        return f"{where} of row {origin.row} in row group {origin.row_group} of {origin.file.name}"


class CellReader:
    """Reads `ImageCell`s' bytes again, keeping the last `keep` (row group, column) reads
    (0: none). Safe to share between threads (the job's planner and the engine); pickles
    without what it keeps."""

    def __init__(self, keep: int = DEFAULT_KEPT_GROUPS) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.keep = keep
        self.reads = 0  # row group columns read, for tests and benchmarks
        self._columns: OrderedDict[tuple[str, str, int, str], pa.Array] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"keep": self.keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["keep"])  # type: ignore[misc]

    @property
    def kept_groups(self) -> int:
        return len(self._columns)

    def read(self, cell: ImageCell) -> bytes:
        """The bytes stored at `cell`; `ImageError` when the file cannot be read or the cell
        holds no image bytes now (the file changed after the job read it)."""
        origin = cell.origin
        key = (origin.file.path, origin.file_format, origin.row_group, cell.column)
        with self._lock:
            column = self._columns.get(key)
            if column is not None:
                self._columns.move_to_end(key)
        if column is None:
            column = _read_column(origin, cell.column)
            with self._lock:
                self.reads += 1
                if self.keep:
                    self._columns[key] = column
                    self._columns.move_to_end(key)
                    while len(self._columns) > self.keep:
                        self._columns.popitem(last=False)
        return _cell_bytes(column, cell)


def _read_column(origin: CellOrigin, column: str) -> pa.Array:
    file = origin.file
    try:
        if origin.file_format == "arrow":
            from astrai_batch.io import arrow_input

            batches = list(arrow_input.read_batches(file, [column], [origin.row_group], 1 << 30))
            table = pa.Table.from_batches(batches) if batches else None
        else:
            with file.open_input_file() as handle, pq.ParquetFile(handle) as parquet_file:
                table = parquet_file.read_row_group(origin.row_group, columns=[column])
    except FileNotFoundError:
        raise ImageError(f"{file.shown} is gone: its images cannot be read again") from None
    except (OSError, pa.ArrowException, IndexError, KeyError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ImageError(f"{file.shown} cannot be read again for its images: {text}") from None
    if table is None or table.num_columns != 1:
        raise ImageError(f"{file.shown} changed after the job first read it")
    return table.column(0).combine_chunks()


def _cell_bytes(column: pa.Array, cell: ImageCell) -> bytes:
    changed = ImageError(f"image at {cell.shown} changed after the job first read it")
    if cell.origin.row >= len(column):
        raise changed
    value = column[cell.origin.row]
    if cell.item is not None:
        if not isinstance(value, (pa.ListScalar, pa.LargeListScalar, pa.FixedSizeListScalar)):
            raise changed
        if not value.is_valid or cell.item >= len(value):
            raise changed
        value = value.values[cell.item]
    if isinstance(value, pa.StructScalar):
        value = value.get("bytes") if value.is_valid else None
    if not isinstance(value, (pa.BinaryScalar, pa.LargeBinaryScalar)) or not value.is_valid:
        raise changed
    return value.as_py()
