"""JSON Lines input (``.jsonl``, or gzip-compressed ``.jsonl.gz``), streamed line by line.

Blank lines are skipped and are not rows. The row shape, and the column names that
``--prompt-column``, ``--id-column`` and ``--keep-column`` are checked against, come from the
first line that is a JSON object (a key that later lines use must appear there, if only as
null). A line that is not valid JSON or not an object becomes a row error
(``line 7: invalid JSON: Expecting value at column 1``,
``line 3: expected a JSON object, got array``), never a failure of the whole input. Keep
columns are written as strings: string values as they are, anything else as compact JSON,
since JSON lines carry no column types to reproduce.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from astrai_batch.errors import InputError
from astrai_batch.io.input_source import InputSource, check_start
from astrai_batch.io.row_parsing import parse_record, unreadable_row
from astrai_batch.io.rows import InputRow, RowPlan, RowProblem
from astrai_batch.io.shape_detection import plan_for_columns

GZIP_MAGIC = b"\x1f\x8b"

JSON_TYPE_NAMES = (
    (bool, "boolean"),
    (int, "number"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


class JsonlSource(InputSource):
    def __init__(self, path: Path, plan: RowPlan, columns: Sequence[str], compressed: bool) -> None:
        super().__init__(path, "jsonl", plan, columns, [path])
        self.compressed = compressed

    def count_rows(self) -> int:
        return sum(1 for _ in _nonblank_lines(self.path, self.compressed))

    def kept_schema(self) -> pa.Schema:
        return pa.schema([pa.field(name, pa.string()) for name in self.plan.keep_columns])

    def iter_rows(self, start: int = 0) -> Iterator[InputRow]:
        check_start(start)
        return self._rows_from(start)

    def _rows_from(self, start: int) -> Iterator[InputRow]:
        for index, (line_number, raw) in enumerate(_nonblank_lines(self.path, self.compressed)):
            # Skipped lines are only counted, never decoded or parsed.
            if index >= start:
                yield self._row(raw, line_number, index)

    def _row(self, raw: bytes, line_number: int, index: int) -> InputRow:
        try:
            value = decode_line(raw, line_number)
        except RowProblem as problem:
            return unreadable_row(index, str(problem), self.plan)
        return parse_record(value, index, self.plan)


def open_jsonl(
    path: Path,
    *,
    prompt_column: str | None,
    id_column: str | None,
    keep_columns: Sequence[str],
) -> JsonlSource:
    if path.is_dir():
        raise InputError(f"{path} is a directory; only Parquet input can be a directory")
    compressed = is_gzip(path)
    first = _first_object(path, compressed)
    if first is None:
        raise InputError(f"no JSON object line in {path.name}: cannot tell the row shape")
    plan = plan_for_columns(
        list(first),
        path.name,
        prompt_column=prompt_column,
        shape_of_column=lambda name: _shape_of_value(first[name]),
        id_column=id_column,
        keep_columns=keep_columns,
        kept_as_json_text=True,
    )
    return JsonlSource(path, plan, list(first), compressed)


def is_gzip(path: Path) -> bool:
    """By suffix, or by the gzip magic bytes for a compressed file named plain .jsonl."""
    if path.name.lower().endswith(".gz"):
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def decode_line(raw: bytes, line_number: int) -> dict[str, Any]:
    """The line's JSON object; RowProblem saying why it is not one."""
    try:
        # utf-8-sig drops a byte-order mark (some Windows tools start files with one); the
        # line break goes so error columns refer to this line, not to a "line 2" of it.
        text = raw.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise RowProblem(f"line {line_number}: invalid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowProblem(
            f"line {line_number}: invalid JSON: {exc.msg} at column {exc.colno}"
        ) from None
    except RecursionError:
        raise RowProblem(f"line {line_number}: invalid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise RowProblem(f"line {line_number}: expected a JSON object, got {_json_type(value)}")
    return value


def _nonblank_lines(path: Path, compressed: bool) -> Iterator[tuple[int, bytes]]:
    """(1-based physical line number, raw bytes) of every non-blank line."""
    try:
        with _open_binary(path, compressed) as handle:
            for line_number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield line_number, raw
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"cannot read {path.name}: {exc}") from exc


def _open_binary(path: Path, compressed: bool) -> IO[bytes]:
    if compressed:
        return gzip.open(path, "rb")
    return path.open("rb")


def _first_object(path: Path, compressed: bool) -> dict[str, Any] | None:
    for line_number, raw in _nonblank_lines(path, compressed):
        try:
            return decode_line(raw, line_number)
        except RowProblem:
            continue
    return None


def _shape_of_value(value: Any) -> str:
    """The shape an explicitly named prompt column has, judged by its first value."""
    if isinstance(value, list) and value:
        head = value[0]
        if isinstance(head, int) and not isinstance(head, bool):
            return "prompt_token_ids"
        if isinstance(head, dict):
            return "messages"
    return "prompt"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for python_type, json_name in JSON_TYPE_NAMES:
        if isinstance(value, python_type):
            return json_name
    return type(value).__name__
