"""A complete checkpoint's records in input order, for the final files.

A local run's parts hold a window's records in the order they finished: each window is read
and sorted back into input order (memory: one window of results). A Ray run's shard parts
each hold their rows in input order, but the output needs all shards merged: it is assembled
range by range of input indices (`RANGE_ROWS` at a time), every part's rows in the range
read (row-group statistics skip the rest) and sorted (memory: one range of results).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa

from astrai_batch.errors import OutputError
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.records import INDEX_COLUMN
from astrai_batch.jobs.output.shard_parts import read_range

RANGE_ROWS = 10_000
SHARDS_KEY = "astrai_batch.shards"
_ORDER = [(INDEX_COLUMN, "ascending"), ("sample_index", "ascending")]


def ordered_tables(
    checkpoint: Checkpoint, columns: list[str], total_rows: int
) -> Iterator[pa.Table]:
    """Every record, `columns` only, in input order (row index, then sample index)."""
    wanted = list(dict.fromkeys([*columns, INDEX_COLUMN, "sample_index"]))
    if checkpoint.executor.name == "ray":
        yield from _shard_tables(checkpoint, columns, wanted, total_rows)
        return
    for number in checkpoint.windows():
        paths = checkpoint.part_paths(number)
        if paths:
            table = pa.concat_tables(path.read_parquet(wanted) for path in paths)
            yield table.sort_by(_ORDER).select(columns)


def _shard_tables(
    checkpoint: Checkpoint, columns: list[str], wanted: list[str], total_rows: int
) -> Iterator[pa.Table]:
    parts = checkpoint.part_paths()
    for first in range(0, total_rows, RANGE_ROWS):
        end = min(first + RANGE_ROWS, total_rows)
        table = pa.concat_tables(read_range(part, wanted, first, end) for part in parts)
        table = table.sort_by(_ORDER)
        keys = list(
            zip(
                table.column(INDEX_COLUMN).to_pylist(),
                table.column("sample_index").to_pylist(),
                strict=True,
            )
        )
        found = len({index for index, _ in keys})
        if found != end - first:
            raise OutputError(
                f"the shards hold {found} of the {end - first} rows {first}..{end - 1}"
            )
        if len(set(keys)) != len(keys):
            raise OutputError(
                f"two shards hold the same rows in {first}..{end - 1}; rerun with --restart"
            )
        yield table.select(columns)


def shards_metadata(checkpoint: Checkpoint) -> dict[str, str]:
    """The stats file's extra metadata of a Ray run: per shard, rows and prefix groups."""
    if checkpoint.executor.name != "ray":
        return {}
    infos = checkpoint.shard_infos()
    per_shard = [
        {"shard": s, "rows": infos[s].stats.input_rows, "prefix_groups": infos[s].prefix_groups}
        for s in sorted(infos)
    ]
    return {SHARDS_KEY: json.dumps(per_shard)}
