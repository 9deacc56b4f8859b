"""A job's final commit, the same for every executor: the stats file, then the output (so a
visible output always has its stats beside it), each written atomically from the complete
checkpoint's records in input order (`output.part_tables`).

Whether an output found at the start is this checkpoint's finished work (a crash between
the output's commit and the checkpoint's removal) is `output.output_guard`'s question.
"""

from __future__ import annotations

import pyarrow as pa

from astrai_batch.io.filesystems import AtomicObject, Location
from astrai_batch.jobs.crash_points import crash_point
from astrai_batch.jobs.executors.base import ModelFacts
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.openai_options import served_names
from astrai_batch.jobs.output.assembly import (
    OPENAI_COLUMNS,
    write_openai_tables,
    write_parquet_stream,
    write_stats,
)
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.parquet_dir import write_parquet_dir
from astrai_batch.jobs.output.part_tables import ordered_tables, shards_metadata


def write_outputs(
    config: JobConfig,
    output: Location,
    stats: Location,
    checkpoint: Checkpoint,
    final_schema: pa.Schema,
    metadata: dict[str, str],
    model: ModelFacts,
    total_rows: int,
) -> None:
    adapters = [name for name, _ in config.lora] if config.lora else None
    write_stats(checkpoint, stats, {**metadata, **shards_metadata(checkpoint)}, adapters)
    crash_point("stats_written")
    if config.output_format == "parquet":
        tables = ordered_tables(checkpoint, final_schema.names, total_rows)
        target = AtomicObject(output, overwrite=config.overwrite)
        write_parquet_stream(target, tables, final_schema, metadata)
    elif config.output_format == "parquet-dir":
        tables = ordered_tables(checkpoint, final_schema.names, total_rows)
        write_parquet_dir(output, tables, final_schema, metadata, config.overwrite)
    else:
        write_openai_tables(
            ordered_tables(checkpoint, OPENAI_COLUMNS, total_rows),
            output,
            model_name=served_names(config.model, model.name, config.served_model_name)[0],
            tokenizer=model.tokenizer,
            overwrite=config.overwrite,
            created=checkpoint.created,
        )
    crash_point("output_written")
