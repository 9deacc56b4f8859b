"""Parquet output: a streaming row writer and a one-shot table writer, both atomic.

Rows are buffered until a full row group is ready, so memory stays at one row group however
long the job runs. Key-value metadata (job config, model, fingerprint; the caller encodes
values as JSON strings) is stored in the Parquet schema metadata and read back with
`read_parquet_metadata`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.errors import InputError, OutputError
from astrai_batch.io.atomic import AtomicFile

DEFAULT_ROW_GROUP_SIZE = 10_000


class ParquetRowWriter:
    """Streams dict rows into `path` atomically; use as a context manager.

    Leaving the `with` block normally commits; leaving it by an exception aborts, removing
    the temporary file and leaving any existing target untouched. Every row must have exactly
    the schema's columns (a missing or unknown key is a caller bug, reported at once).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        metadata: Mapping[str, str] | None = None,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        overwrite: bool = False,
    ) -> None:
        if row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size}")
        self.schema = with_metadata(schema, metadata)
        self.row_group_size = row_group_size
        self.rows_written = 0
        self._column_names = frozenset(schema.names)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._file = AtomicFile(path, overwrite=overwrite)
        try:
            self._writer = pq.ParquetWriter(self._file.handle, self.schema)
        except BaseException:
            self._file.abort()
            raise

    @property
    def path(self) -> Path:
        return self._file.target

    @property
    def state(self) -> str:
        """'open', 'committed' or 'aborted'."""
        return self._file.state

    def write_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Accept rows; whole row groups are written out as soon as they are full."""
        self._file.require_open()
        if not rows:
            return
        table = self._to_table(rows)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows_written += table.num_rows
        while self._pending_rows >= self.row_group_size:
            self._write_pending(self.row_group_size)

    def commit(self) -> None:
        """Write the last partial row group, close, fsync, and move onto the target."""
        self._file.require_open()
        try:
            if self._pending_rows:
                self._write_pending(self._pending_rows)
            self._writer.close()
        except BaseException:
            self.abort()
            raise
        self._file.commit()

    def abort(self) -> None:
        """Discard everything written; a no-op once committed or aborted."""
        if self._file.state != "open":
            return
        # The file is being thrown away; a failing close changes nothing.
        with contextlib.suppress(OSError, pa.ArrowException):
            self._writer.close()
        self._file.abort()

    def check_invariants(self) -> None:
        self._file.check_invariants()
        buffered = sum(table.num_rows for table in self._pending)
        if buffered != self._pending_rows or buffered >= self.row_group_size:
            raise OutputError(
                f"writer for {self.path} buffers {buffered} rows but counts "
                f"{self._pending_rows} (row group size {self.row_group_size})"
            )

    def __enter__(self) -> ParquetRowWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._file.state == "open":
            self.commit()

    def _to_table(self, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
        for position, row in enumerate(rows):
            keys = set(row)
            if keys != self._column_names:
                missing = sorted(self._column_names - keys)
                unknown = sorted(keys - self._column_names)
                raise OutputError(
                    f"row {position} does not match the output schema: "
                    f"missing {missing}, unknown {unknown}"
                )
        try:
            table = pa.Table.from_pylist(list(rows), schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise OutputError(f"rows do not fit the output schema: {exc}") from exc
        for field in self.schema:
            if not field.nullable and table.column(field.name).null_count:
                raise OutputError(f"column {field.name!r} must not be null")
        return table

    def _write_pending(self, count: int) -> None:
        combined = pa.concat_tables(self._pending)
        self._writer.write_table(combined.slice(0, count), row_group_size=count)
        rest = combined.slice(count)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows


def write_table_atomic(
    path: str | os.PathLike[str],
    table: pa.Table,
    *,
    metadata: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> None:
    """Write a small table (e.g. the stats file) in one go, with the same atomic guarantees."""
    output = AtomicFile(path, overwrite=overwrite)
    try:
        stamped = table.replace_schema_metadata(with_metadata(table.schema, metadata).metadata)
        pq.write_table(stamped, output.handle)
    except BaseException:
        output.abort()
        raise
    output.commit()


def with_metadata(schema: pa.Schema, metadata: Mapping[str, str] | None) -> pa.Schema:
    """`schema` with `metadata` merged into its key-value metadata (new keys win)."""
    if not metadata:
        return schema
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(
                f"metadata keys and values must be strings, got {key!r}: {type(value).__name__}"
            )
    merged = {**(schema.metadata or {}), **{k.encode(): v.encode() for k, v in metadata.items()}}
    return schema.with_metadata(merged)


def read_parquet_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All rows of a (finished, small enough) Parquet file as dicts."""
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read Parquet file {path}: {exc}") from exc


def read_parquet_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key-value metadata stored by `ParquetRowWriter` / `write_table_atomic`."""
    try:
        stored = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read Parquet file {path}: {exc}") from exc
    return {key.decode(): value.decode() for key, value in stored.items()}
