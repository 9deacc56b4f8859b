"""The final files of a sharded job, assembled from its shard parts.

Shard parts each hold their rows in input order; the output needs all rows in input order,
so it is assembled range by range of input indices (`RANGE_ROWS` at a time): every part's
rows in the range are read (row-group statistics skip the rest), sorted and written. Memory
is one range of results, whatever the size of the job.

Formats: ``parquet`` (one file, the same schema and metadata as a local run), ``openai-jsonl``,
``parquet-dir`` (see `parquet_dir`). The stats file has
one row per worker shard (its number in the ``window`` column) and the total; its metadata
adds ``astrai_batch.shards``: per shard, rows and prefix groups.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import AtomicObject, Location, write_table_at
from astrai_batch.jobs.executors.shard_store import ShardInfo, ShardStore
from astrai_batch.jobs.output.assembly import (
    OPENAI_COLUMNS,
    stats_location,
    write_openai_tables,
    write_parquet_stream,
)
from astrai_batch.jobs.output.parquet_dir import write_parquet_dir
from astrai_batch.jobs.output.records import INDEX_COLUMN
from astrai_batch.jobs.output.stats import stats_table

RANGE_ROWS = 10_000
SHARDS_KEY = "astrai_batch.shards"


def ordered_tables(
    store: ShardStore, shards: list[int], columns: list[str], total_rows: int
) -> Iterator[pa.Table]:
    """All records, `columns` only, in input order, one range of input indices at a time."""
    wanted = list(dict.fromkeys([*columns, INDEX_COLUMN, "sample_index"]))
    for first in range(0, total_rows, RANGE_ROWS):
        end = min(first + RANGE_ROWS, total_rows)
        parts = [store.read_range(shard, wanted, first, end) for shard in shards]
        table = pa.concat_tables(parts).sort_by(
            [(INDEX_COLUMN, "ascending"), ("sample_index", "ascending")]
        )
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


def write_sharded_outputs(
    *,
    output: Location,
    output_format: str,
    store: ShardStore,
    infos: Mapping[int, ShardInfo],
    schema: pa.Schema,
    metadata: dict[str, str],
    total_rows: int,
    overwrite: bool,
    tokenizer: Any,
    model_name: str,
    created: int,
) -> None:
    """Stats first, then the output (committed last, so an output always has its stats)."""
    shards = sorted(infos)
    per_shard = [
        {"shard": s, "rows": infos[s].stats.input_rows, "prefix_groups": infos[s].prefix_groups}
        for s in shards
    ]
    stats = stats_table({s: infos[s].stats for s in shards})
    write_table_at(
        stats_location(output),
        stats,
        metadata={**metadata, SHARDS_KEY: json.dumps(per_shard)},
        overwrite=True,
    )
    if output_format == "parquet":
        tables = ordered_tables(store, shards, schema.names, total_rows)
        write_parquet_stream(AtomicObject(output, overwrite=overwrite), tables, schema, metadata)
    elif output_format == "openai-jsonl":
        write_openai_tables(
            ordered_tables(store, shards, OPENAI_COLUMNS, total_rows),
            output,
            model_name=model_name,
            tokenizer=tokenizer,
            overwrite=overwrite,
            created=created,
        )
    else:
        tables = ordered_tables(store, shards, schema.names, total_rows)
        write_parquet_dir(output, tables, schema, metadata, overwrite)
