"""JSON Lines input (``.jsonl``, or gzip-compressed ``.jsonl.gz``), streamed line by line.

Blank lines are skipped and are not rows. Every line is read by its own shape and id. Opening
the file reads it once through (`_scan`): it counts the rows, collects the keys that
``--prompt-column``, ``--id-column`` and ``--keep-columns`` are checked against (of every
line, up to `KEY_LIMIT` names), tells whether any line has an id field, and finds repeated
ids (`row_ids`), so rows can be read from any position with the same ids and errors. A line
that is not valid JSON or not an object becomes a row error
(``line 7: invalid JSON: Expecting value at column 1``,
``line 3: expected a JSON object, got list``), never a failure of the whole input. Keep
columns keep their JSON types, as pyarrow infers them over every line (`kept_types`); a
column whose values have no one type is written as JSON text (strings as they are).
"""

from __future__ import annotations

import array
import gzip
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from astrai_batch.errors import InputError
from astrai_batch.io.data_url_spans import locate_data_url
from astrai_batch.io.filesystems import Location
from astrai_batch.io.image_sources import DEFAULT_MAX_IMAGES_PER_ROW, ImageRef
from astrai_batch.io.input_source import InputSource, check_start
from astrai_batch.io.kept_types import KeptTypes
from astrai_batch.io.row_ids import DuplicateIds, IdScan, read_ids
from astrai_batch.io.row_parsing import parse_record, unreadable_row
from astrai_batch.io.rows import ID_FIELDS, InputRow, RowPlan, RowProblem
from astrai_batch.io.shape_detection import plan_for_columns, row_shape, source_shape
from astrai_batch.json_types import json_type, parse_json

GZIP_MAGIC = b"\x1f\x8b"
# Key names collected for the option checks; bounds memory on lines with ever new keys.
KEY_LIMIT = 10_000
# Every this many rows the open scan records where the row starts (`RowMarks`).
OFFSET_STRIDE = 256


class JsonlSource(InputSource):
    def __init__(
        self,
        path: Location,
        plan: RowPlan,
        columns: Sequence[str],
        compressed: bool,
        *,
        rows: int,
        shape: str,
        duplicates: DuplicateIds,
        marks: RowMarks,
        kept: pa.Schema,
    ) -> None:
        super().__init__(path, "jsonl", plan, columns, [path], shape=shape, duplicates=duplicates)
        self.compressed = compressed
        self._rows = rows
        self.marks = marks
        self._kept = kept

    def count_rows(self) -> int:
        return self._rows

    def kept_schema(self) -> pa.Schema:
        return self._kept

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[InputRow]:
        check_start(start, stop)
        return self._rows_between(start, self._rows if stop is None else min(stop, self._rows))

    def _rows_between(self, start: int, stop: int) -> Iterator[InputRow]:
        if start >= stop:
            return
        # Begin at the last recorded row at or before `start`: at most OFFSET_STRIDE - 1
        # rows are split off and dropped unparsed (none when `start` is a multiple of it).
        mark = start // OFFSET_STRIDE
        index = mark * OFFSET_STRIDE
        lines = _nonblank_lines(
            self.path,
            self.compressed,
            offset=self.marks.offsets[mark],
            line_number=self.marks.lines[mark],
        )
        for line_number, raw, line_start in lines:
            if index >= start:
                yield self._row(raw, line_number, index, line_start)
            index += 1
            if index >= stop:
                return

    def _row(self, raw: bytes, line_number: int, index: int, line_start: int) -> InputRow:
        try:
            value = decode_line(raw, line_number)
        except RowProblem as problem:
            return unreadable_row(index, str(problem), self.plan)
        row = parse_record(value, index, self.plan, self.duplicates)
        if row.images and not self.compressed:
            # a waiting row names its large data URLs by their place in the file, not
            # their text (a gzip stream cannot be read again from the middle: kept)
            row = replace(
                row, images=tuple(self._located(ref, raw, line_start) for ref in row.images)
            )
        return row

    def _located(self, ref: ImageRef, raw: bytes, line_start: int) -> ImageRef:
        if ref.url is None:
            return ref
        span = locate_data_url(ref.url, raw, self.path, line_start)
        return ref if span is None else ImageRef(span=span, detail=ref.detail)


@dataclass(frozen=True)
class RowMarks:
    """Where every `OFFSET_STRIDE`-th row starts: its byte offset in the file as read
    (for gzip, in the decompressed stream) and its physical line number. 16 bytes per
    `OFFSET_STRIDE` rows; recorded by the open scan."""

    offsets: array.array = field(default_factory=lambda: array.array("q"))
    lines: array.array = field(default_factory=lambda: array.array("q"))

    def add(self, offset: int, line_number: int) -> None:
        self.offsets.append(offset)
        self.lines.append(line_number)


def open_jsonl(
    path: Location,
    *,
    prompt_column: str | None,
    id_column: str | None,
    keep_columns: Sequence[str],
    task: str = "generate",
    image_column: str | None = None,
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW,
) -> JsonlSource:
    if path.is_dir(InputError):
        raise InputError(f"{path.shown} is a directory; only Parquet input can be a directory")
    compressed = is_gzip(path)
    id_fields = (id_column,) if id_column else ID_FIELDS
    scan = _scan(path, compressed, prompt_column, id_fields, KeptTypes(keep_columns))
    keys = list(scan.keys)
    if scan.rows == 0:
        # No lines (or blank ones only) is a job of no rows, as a Parquet file without rows
        # is: the columns the options name exist, with no values.
        keys = [name for name in (prompt_column, id_column, image_column, *keep_columns) if name]
    elif not scan.objects:
        raise InputError(f"no JSON object line in {path.name}: cannot tell the row shape")
    plan = plan_for_columns(
        keys,
        path.name,
        prompt_column=prompt_column,
        prompt_column_shape=lambda name: None,  # each value's type decides
        usable=bool(scan.shapes) or scan.rows == 0,
        id_column=id_column,
        keep_columns=keep_columns,
        task=task,
        image_column=image_column,
        max_images_per_row=max_images_per_row,
        json_text_columns=scan.kept.json_text_columns,
    )
    return JsonlSource(
        path,
        plan,
        keys,
        compressed,
        rows=scan.rows,
        shape=source_shape(scan.shapes) if scan.rows else "empty",
        duplicates=scan.ids.duplicates(),
        marks=scan.marks,
        kept=scan.kept.schema(),
    )


@dataclass
class _Scan:
    """What one pass over a JSONL file tells before any row is read."""

    rows: int = 0
    objects: int = 0
    keys: dict[str, None] = field(default_factory=dict)  # an ordered set
    shapes: dict[str, None] = field(default_factory=dict)
    ids: IdScan = field(default_factory=IdScan)
    marks: RowMarks = field(default_factory=RowMarks)
    kept: KeptTypes = field(default_factory=lambda: KeptTypes(()))


def _scan(
    path: Location,
    compressed: bool,
    prompt_column: str | None,
    id_fields: Sequence[str],
    kept: KeptTypes,
) -> _Scan:
    scan = _Scan(kept=kept)
    for index, (line_number, raw, offset) in enumerate(_nonblank_lines(path, compressed)):
        if index % OFFSET_STRIDE == 0:
            scan.marks.add(offset, line_number)
        scan.rows += 1
        try:
            value = decode_line(raw, line_number)
        except RowProblem:
            continue
        scan.objects += 1
        if len(scan.keys) < KEY_LIMIT:
            scan.keys.update(dict.fromkeys(value))
        shape = row_shape(value, prompt_column)
        if shape is not None:
            scan.shapes[shape] = None
        scan.ids.add(index, *read_ids(value, id_fields))
        kept.add(value)
    return scan


def is_gzip(path: Location) -> bool:
    """By suffix, or by the gzip magic bytes for a compressed file named plain .jsonl."""
    if path.name.lower().endswith(".gz"):
        return True
    try:
        with path.open_input_stream() as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise InputError(f"cannot read {path.shown}: {exc.strerror or exc}") from exc


def decode_line(raw: bytes, line_number: int) -> dict[str, Any]:
    """The line's JSON object; RowProblem saying why it is not one."""
    try:
        # utf-8-sig drops a byte-order mark (some Windows tools start files with one); the
        # line break goes so error columns refer to this line, not to a "line 2" of it.
        text = raw.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise RowProblem(f"line {line_number}: invalid UTF-8 at byte {exc.start}") from None
    try:
        value = parse_json(text)
        if isinstance(value, dict):
            return value
    except ValueError as exc:
        raise RowProblem(f"line {line_number}: invalid JSON: {exc}") from None
    raise RowProblem(f"line {line_number}: expected a JSON object, got {json_type(value)}")


def _nonblank_lines(
    path: Location, compressed: bool, *, offset: int = 0, line_number: int = 1
) -> Iterator[tuple[int, bytes, int]]:
    """(1-based physical line number, raw bytes, byte offset) of every non-blank line from
    byte `offset` (the start of line `line_number`) on. The file is read as a stream on any
    filesystem (a remote object is never downloaded whole first); a plain file is read from
    `offset` on, a gzip one is decompressed from its start (a gzip stream cannot be entered
    in the middle) with the bytes before `offset` dropped undecoded. Offsets count the
    bytes as read (decompressed for gzip), so a local and a remote copy read identically."""
    try:
        with path.open_lines(0 if compressed else offset) as stream:
            handle = gzip.GzipFile(fileobj=stream, mode="rb") if compressed else stream
            if compressed and offset:
                handle.seek(offset)
            position = offset
            for number, raw in enumerate(handle, start=line_number):
                if raw.strip():
                    yield number, raw, position
                position += len(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"cannot read {path.name}: {exc}") from exc
