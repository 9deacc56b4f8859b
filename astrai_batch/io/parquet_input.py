"""Parquet input: one file, or a directory of files read in name order as one input; and
the same for Arrow IPC files (`arrow_input`: a `datasets` directory), whose record batches
stand for row groups.

Rows are streamed by record batches, reading only the columns the plan needs; `start` skips
whole files and row groups using the footer metadata, so resuming deep into a large input
does not decode what it skips. Each row is read by its own shape where the columns allow
several (a null ``messages`` beside a ``prompt`` is a prompt row). Opening an input with an
id column reads the id columns once through to find repeated ids (`row_ids`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.errors import InputError
from astrai_batch.io import arrow_input
from astrai_batch.io.filesystems import Location
from astrai_batch.io.image_cells import CellOrigin
from astrai_batch.io.image_sources import DEFAULT_MAX_IMAGES_PER_ROW
from astrai_batch.io.input_source import InputSource, check_start
from astrai_batch.io.row_ids import DuplicateIds, IdScan, read_ids
from astrai_batch.io.row_parsing import parse_record
from astrai_batch.io.rows import InputRow, RowPlan
from astrai_batch.io.shape_detection import (
    no_prompt_column,
    plan_for_columns,
    shapes_of_columns,
    source_shape,
)

BATCH_ROWS = 1024

STRING_EXPECTATION = "a string"
MESSAGES_EXPECTATION = "a list of {role, content} structs"
TOKEN_IDS_EXPECTATION = "a list of integers"
BODY_EXPECTATION = "a struct or a JSON string"
IMAGE_EXPECTATION = "binary, a string, a {bytes, path} struct, or a list of those"


@dataclass(frozen=True)
class ParquetPart:
    """One file of the input, with what its footer says about row layout (for an Arrow
    file, `row_group_rows` counts its record batches' rows)."""

    path: Location
    schema: pa.Schema
    row_group_rows: tuple[int, ...]
    file_format: str = "parquet"

    @property
    def label(self) -> str:
        return "Arrow" if self.file_format == "arrow" else "Parquet"

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)


class ParquetSource(InputSource):
    def __init__(
        self, path: Location, plan: RowPlan, parts: Sequence[ParquetPart], *, shape: str
    ) -> None:
        super().__init__(
            path,
            parts[0].file_format,
            plan,
            parts[0].schema.names,
            [p.path for p in parts],
            shape=shape,
            duplicates=_duplicate_ids(parts, plan),
        )
        self.parts = tuple(parts)

    def count_rows(self) -> int:
        return sum(part.num_rows for part in self.parts)

    def kept_schema(self) -> pa.Schema:
        first = self.parts[0].schema
        return pa.schema([first.field(name) for name in self.plan.keep_columns])

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[InputRow]:
        check_start(start, stop)
        total = self.count_rows()
        return self._rows_between(start, total if stop is None else min(stop, total))

    def _rows_between(self, start: int, stop: int) -> Iterator[InputRow]:
        part_first_index = 0
        for part in self.parts:
            if part_first_index >= stop:
                return
            if part_first_index + part.num_rows <= start:
                part_first_index += part.num_rows
                continue
            # Read only the groups that overlap [start, stop), whatever their sizes: skip the
            # leading groups that end before `start`, stop before the first at `stop`.
            groups, first_row, index = [], None, part_first_index
            for number, rows in enumerate(part.row_group_rows):
                if index + rows > start and index < stop:
                    groups.append(number)
                    first_row = index if first_row is None else first_row
                index += rows
            if first_row is not None:
                yield from self._part_rows(
                    part, groups, first_row, skip=max(0, start - first_row), stop=stop
                )
            part_first_index += part.num_rows

    def _part_rows(
        self, part: ParquetPart, groups: list[int], index: int, skip: int, stop: int
    ) -> Iterator[InputRow]:
        """Rows of `groups` in `part` before row `stop`; `index` is the first group's first
        row, `skip` how many of its leading rows to drop."""
        columns = self.plan.source_columns(part.schema.names)
        # image bytes keep where they are stored (`io.image_cells`): a record's row group and
        # row in it, from the part's row-group sizes
        group_starts = list(itertools.accumulate(part.row_group_rows, initial=0))
        in_part = group_starts[groups[0]] - index  # a row's index in the part, less `index`
        try:
            for batch in _record_batches(part, columns, groups):
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    index += batch.num_rows
                    continue
                if skip:
                    batch = batch.slice(skip)
                    index += skip
                    skip = 0
                for record in batch.to_pylist():
                    if index >= stop:
                        return
                    origin = None
                    if self.plan.image_column is not None:
                        row = index + in_part
                        group = bisect.bisect_right(group_starts, row) - 1
                        origin = CellOrigin(
                            part.path, part.file_format, group, row - group_starts[group]
                        )
                    yield parse_record(record, index, self.plan, self.duplicates, origin)
                    index += 1
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read {part.label} file {part.path.name}: {exc}") from exc


def _record_batches(
    part: ParquetPart, columns: list[str], groups: list[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """`part`'s rows in `groups` (all when None), `columns` only, in batches of at most
    BATCH_ROWS rows."""
    if part.file_format == "arrow":
        yield from arrow_input.read_batches(part.path, columns, groups, BATCH_ROWS)
        return
    with part.path.open_input_file() as handle, pq.ParquetFile(handle) as parquet_file:
        yield from parquet_file.iter_batches(
            batch_size=BATCH_ROWS, row_groups=groups, columns=columns
        )


def _duplicate_ids(parts: Sequence[ParquetPart], plan: RowPlan) -> DuplicateIds:
    """The repeated ids of the whole input, reading only its id columns."""
    if not plan.has_ids:
        return DuplicateIds.none()
    scan, index = IdScan(), 0
    for part in parts:
        names = part.schema.names
        columns = [name for name in dict.fromkeys([*plan.id_fields, "custom_id"]) if name in names]
        try:
            for batch in _record_batches(part, columns):
                for record in batch.to_pylist():
                    scan.add(index, *read_ids(record, plan.id_fields))
                    index += 1
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read {part.label} file {part.path.name}: {exc}") from exc
    return scan.duplicates()


def open_parquet(
    path: Location,
    *,
    prompt_column: str | None,
    id_column: str | None,
    keep_columns: Sequence[str],
    task: str = "generate",
    files: Sequence[Location] | None = None,
    file_format: str = "parquet",
    image_column: str | None = None,
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW,
) -> ParquetSource:
    """`files` (in reading order; by default `path` itself or the Parquet files of the
    directory `path`) as one input; `file_format` "parquet" or "arrow" (Arrow IPC)."""
    chosen = list(files) if files is not None else parquet_files(path)
    parts = [_read_footer(file, file_format) for file in chosen]
    first = parts[0]
    plan = plan_for_columns(
        first.schema.names,
        first.path.name,
        prompt_column=prompt_column,
        prompt_column_shape=lambda name: _shape_of_type(first.schema.field(name).type, name, first),
        usable=bool(shapes_of_columns(first.schema.names)),
        id_column=id_column,
        keep_columns=keep_columns,
        task=task,
        image_column=image_column,
        max_images_per_row=max_images_per_row,
    )
    for part in parts:
        _check_part(part, first, plan)
    if plan.prompt_column_shape is not None:
        shape = plan.prompt_column_shape
    else:
        shape = source_shape(
            dict.fromkeys(shape for part in parts for shape in shapes_of_columns(part.schema.names))
        )
    return ParquetSource(path, plan, parts, shape=shape)


def parquet_files(path: Location) -> list[Location]:
    """`path` itself, or the Parquet files directly inside the directory `path`."""
    if not path.is_dir(InputError):
        return [path]
    # Hidden and underscore files are Spark / Hadoop markers (_SUCCESS, _metadata), not data.
    files = [
        entry
        for entry in path.files(InputError)
        if entry.name.endswith(".parquet") and not entry.name.startswith((".", "_"))
    ]
    if not files:
        raise InputError(f"no .parquet files in directory {path.shown}")
    return files


def _read_footer(path: Location, file_format: str = "parquet") -> ParquetPart:
    if file_format == "arrow":
        try:
            schema, batch_rows = arrow_input.read_layout(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read Arrow file {path.name}: {exc}") from exc
        return ParquetPart(path, schema, batch_rows, file_format="arrow")
    try:
        with path.open_input_file() as handle, pq.ParquetFile(handle) as parquet_file:
            metadata = parquet_file.metadata
            return ParquetPart(
                path=path,
                schema=parquet_file.schema_arrow,
                row_group_rows=tuple(
                    metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)
                ),
            )
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read Parquet file {path.name}: {exc}") from exc


def _shape_of_type(arrow_type: pa.DataType, column: str, part: ParquetPart) -> str:
    """The shape an explicitly named prompt column has, judged by its Arrow type."""
    if _is_string(arrow_type) or pa.types.is_null(arrow_type):
        return "prompt"
    if _is_list(arrow_type) and pa.types.is_integer(arrow_type.value_type):
        return "prompt_token_ids"
    if _is_list(arrow_type) and pa.types.is_struct(arrow_type.value_type):
        return "messages"
    raise InputError(
        f"prompt column {column!r} in {part.path.name} has type {arrow_type}; expected "
        f"{STRING_EXPECTATION}, {TOKEN_IDS_EXPECTATION}, or {MESSAGES_EXPECTATION}"
    )


def _check_part(part: ParquetPart, first: ParquetPart, plan: RowPlan) -> None:
    """Every file must have a prompt column, the id and keep columns of the first file, and
    prompt columns of types that can hold a prompt."""
    names = part.schema.names
    if plan.prompt_column is None and not shapes_of_columns(names):
        raise no_prompt_column(part.path.name, names)
    id_fields = [name for name in plan.id_fields if name in first.schema.names]
    required = [plan.prompt_column, *id_fields, plan.image_column, *plan.keep_columns]
    for name in dict.fromkeys(name for name in required if name is not None):
        if part.schema.get_field_index(name) < 0:
            raise InputError(
                f"{part.path.name} has no column {name!r}, which the first file "
                f"{first.path.name} has"
            )
    for name in plan.id_fields:
        if name in names and name not in first.schema.names:
            raise InputError(
                f"{part.path.name} has an id column {name!r}, which the first file "
                f"{first.path.name} lacks"
            )
    if plan.prompt_column is not None:
        content = {plan.prompt_column: plan.prompt_column_shape or "prompt"}
    else:
        content = {name: name for name in ("messages", "prompt_token_ids", "prompt")}
        if "custom_id" in names:  # else a column named body is just data
            content["body"] = "openai"
    for name, shape in content.items():
        if name not in names:
            continue
        arrow_type = part.schema.field(name).type
        expectation = _type_problem(shape, arrow_type)
        if expectation is not None:
            raise InputError(
                f"column {name!r} in {part.path.name} has type {arrow_type}; expected {expectation}"
            )
    if plan.image_column is not None:
        arrow_type = part.schema.field(plan.image_column).type
        if not _holds_images(arrow_type):
            raise InputError(
                f"image column {plan.image_column!r} in {part.path.name} has type "
                f"{arrow_type}; expected {IMAGE_EXPECTATION}"
            )
    for name in plan.keep_columns:
        mine, theirs = part.schema.field(name).type, first.schema.field(name).type
        if mine != theirs:
            raise InputError(
                f"keep column {name!r} has type {mine} in {part.path.name} "
                f"but {theirs} in {first.path.name}"
            )


def _type_problem(shape: str, arrow_type: pa.DataType) -> str | None:
    """What the content column should be, when `arrow_type` cannot hold it; else None."""
    if pa.types.is_null(arrow_type):
        return None  # an all-null column: every row reports the missing prompt itself
    if shape == "prompt":
        return None if _is_string(arrow_type) else STRING_EXPECTATION
    if shape == "prompt_token_ids":
        fits = _is_list(arrow_type) and pa.types.is_integer(arrow_type.value_type)
        return None if fits else TOKEN_IDS_EXPECTATION
    if shape == "messages":
        fits = (
            _is_list(arrow_type)
            and pa.types.is_struct(arrow_type.value_type)
            and {"role", "content"} <= {field.name for field in arrow_type.value_type}
        )
        return None if fits else MESSAGES_EXPECTATION
    fits = pa.types.is_struct(arrow_type) or _is_string(arrow_type)
    return None if fits else BODY_EXPECTATION


def _holds_images(arrow_type: pa.DataType, nested: bool = False) -> bool:
    """Binary (bytes), a string (path, URI, data URL), Hugging Face's Image struct
    ``{bytes, path}``, or (once) a list of those; an all-null column holds none."""
    if pa.types.is_null(arrow_type) or _is_string(arrow_type):
        return True
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        names = {field.name for field in arrow_type}
        return bool(names) and names <= {"bytes", "path"}
    return not nested and _is_list(arrow_type) and _holds_images(arrow_type.value_type, True)


def _is_string(arrow_type: pa.DataType) -> bool:
    # pandas categoricals arrive dictionary-encoded; their values read back as plain strings.
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _is_list(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )
