"""The ``parquet-dir`` output: a directory of Parquet parts plus an index, for outputs too
large for one file (or one machine to hold while writing).

Layout: ``part-00000.parquet``, ``part-00001.parquet``, ... holding the output rows in input
order (part k's rows all come before part k+1's), each with the output schema and metadata,
then ``_index.json``: the parts with their first output row and row count, the total and the
metadata. The index is written last and atomically: it is the commit. A directory without
one is the leftover of a failed run and is cleared by the next; readers that honour the
index never see a partial output. Parquet readers (pyarrow, Spark, DuckDB) skip names that
start with ``_``, so the directory reads as one dataset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import AtomicObject, Location, write_table_at

INDEX_NAME = "_index.json"


def check_output_location(output: Location, output_format: str, overwrite: bool) -> None:
    """Refuse an output that exists (unless `overwrite`); clear a directory output a failed
    run left without its index."""
    if not output.exists():
        return
    if output_format == "parquet-dir" and output.is_dir():
        names = output.list_names()
        if INDEX_NAME not in names and all(n.startswith(("part-", ".part-")) for n in names):
            output.delete()
            return
    if overwrite:
        return
    raise OutputError(f"output {output.shown} already exists; pass --overwrite to replace it")


def write_parquet_dir(
    output: Location,
    tables: Iterable[pa.Table],
    schema: pa.Schema,
    metadata: dict[str, str],
    overwrite: bool,
) -> None:
    """A directory of Parquet parts in input order, then its index (the commit)."""
    if overwrite and output.exists():
        output.delete()
    output.make_dir()
    stamped = schema.with_metadata({**(schema.metadata or {}), **metadata})
    entries, first_row = [], 0
    for number, table in enumerate(tables):
        name = f"part-{number:05d}.parquet"
        write_table_at(output.child(name), table.cast(stamped))
        entries.append({"file": name, "first_row": first_row, "rows": table.num_rows})
        first_row += table.num_rows
    index = {"format": 1, "rows": first_row, "parts": entries, "metadata": metadata}
    commit = AtomicObject(output.child(INDEX_NAME))
    try:
        commit.handle.write(json.dumps(index, indent=1).encode())
    except BaseException:
        commit.abort()
        raise
    commit.commit()
