"""The ``parquet-dir`` output: a directory of Parquet parts plus an index, for outputs too
large for one file (or one machine to hold while writing).

Layout: ``part-00000.parquet``, ``part-00001.parquet``, ... holding the output rows in input
order (part k's rows all come before part k+1's), each with the output schema and metadata,
then ``_index.json``: the parts with their first output row and row count, the total and the
metadata (with the run id). Parquet readers (pyarrow, Spark, DuckDB) skip names that start
with ``_``, so the directory reads as one dataset.

The commit never exposes a partial directory and never deletes what this code cannot prove
it wrote (the files an index names, or names carrying the run id):

- Locally the new directory is written beside the output (``.{name}.tmp-{run_id}``) and
  swapped in by one ``renameat2(RENAME_EXCHANGE)`` (two renames where the kernel cannot), so
  a reader sees the old directory or the new one. Only then are the old directory's indexed
  files removed.
- An object store has no directory rename: parts are written into the output under names
  carrying the run id (``part-{run_id}-00000.parquet``) and the index, replaced in one
  request, is the commit; the old index's parts are deleted after it. A reader that lists
  the prefix instead of reading the index may see both runs' parts while a run commits.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from astrai_batch.errors import OutputError
from astrai_batch.io.atomic import exchange_paths, fsync_directory
from astrai_batch.io.filesystems import AtomicObject, Location, write_table_at
from astrai_batch.jobs.output.dir_ownership import (
    INDEX_NAME,
    RUN_ID_KEY,
    index_run_id,
    old_location,
    read_index,
    refuse_replacing,
    remove_owned_dir,
    restore_displaced,
    staging_location,
)

__all__ = ["INDEX_NAME", "check_output_location", "write_parquet_dir"]


def check_output_location(
    output: Location, output_format: str, overwrite: bool, run_id: str | None = None
) -> None:
    """Refuse an output that exists (unless `overwrite`); touches nothing. A parquet-dir
    output may be an empty directory, or hold only files of `run_id`'s killed attempt."""
    if output_format == "parquet-dir":
        refuse_replacing(output, overwrite=overwrite, run_id=run_id)
    elif output.exists() and not overwrite:
        raise OutputError(f"output {output.shown} already exists; pass --overwrite to replace it")


def write_parquet_dir(
    output: Location,
    tables: Iterable[pa.Table],
    schema: pa.Schema,
    metadata: dict[str, str],
    overwrite: bool,
) -> None:
    """A directory of Parquet parts in input order and its index, committed as a whole."""
    run_id = metadata.get(RUN_ID_KEY) or secrets.token_hex(8)
    refuse_replacing(output, overwrite=overwrite, run_id=run_id)
    stamped = schema.with_metadata({**(schema.metadata or {}), **metadata})
    if output.is_local:
        _write_local(output, tables, stamped, metadata, overwrite, run_id)
    else:
        _write_object_store(output, tables, stamped, metadata, overwrite, run_id)


def _write_parts(
    directory: Location, tables: Iterable[pa.Table], stamped: pa.Schema, prefix: str
) -> dict[str, Any]:
    entries, first_row = [], 0
    for number, table in enumerate(tables):
        name = f"{prefix}{number:05d}.parquet"
        write_table_at(directory.child(name), table.cast(stamped), overwrite=True)
        entries.append({"file": name, "first_row": first_row, "rows": table.num_rows})
        first_row += table.num_rows
    return {"format": 1, "rows": first_row, "parts": entries}


def _write_index(directory: Location, index: dict[str, Any], *, overwrite: bool) -> None:
    commit = AtomicObject(directory.child(INDEX_NAME), overwrite=overwrite)
    try:
        commit.handle.write(json.dumps(index, indent=1).encode())
    except BaseException:
        commit.abort()
        raise
    commit.commit()


def _write_local(
    output: Location,
    tables: Iterable[pa.Table],
    stamped: pa.Schema,
    metadata: dict[str, str],
    overwrite: bool,
    run_id: str,
) -> None:
    restore_displaced(output, run_id)
    staging = staging_location(output, run_id)
    remove_owned_dir(staging, run_id)  # a killed attempt's, or what it swapped out
    staging.make_dir()
    index = _write_parts(staging, tables, stamped, "part-")
    _write_index(staging, {**index, "metadata": metadata}, overwrite=False)
    refuse_replacing(output, overwrite=overwrite, run_id=run_id)  # again, right before
    target, new = output.local_path, staging.local_path
    try:
        os.rename(new, target)  # no output yet, or an empty directory: replaced at once
        fsync_directory(target.parent)
        return
    except OSError:
        pass
    if exchange_paths(new, target):
        replaced = staging
    else:
        replaced = old_location(output, run_id)
        os.rename(target, replaced.local_path)
        os.rename(new, target)
        fsync_directory(target.parent)
    remove_owned_dir(replaced, run_id)


def _write_object_store(
    output: Location,
    tables: Iterable[pa.Table],
    stamped: pa.Schema,
    metadata: dict[str, str],
    overwrite: bool,
    run_id: str,
) -> None:
    previous = read_index(output) or {}
    index = _write_parts(output, tables, stamped, f"part-{run_id}-")
    # This job's own committed index (a driver killed before it dropped its checkpoint) is
    # replaced like any output it wrote.
    ours = index_run_id(previous) == run_id
    _write_index(output, {**index, "metadata": metadata}, overwrite=overwrite or ours)
    kept = {entry["file"] for entry in index["parts"]}
    for entry in previous.get("parts", []):
        name = entry.get("file") if isinstance(entry, dict) else None
        if isinstance(name, str) and name not in kept and "/" not in name:
            output.child(name).delete()
