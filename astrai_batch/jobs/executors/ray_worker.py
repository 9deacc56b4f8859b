"""The engine worker of a sharded job: a callable class Ray Data runs in an actor pool.

Each actor loads the model once and runs one `Engine` per shard it is given (`map_groups`
hands it all rows of one shard). Torch's thread count is set explicitly, since Ray sets
OMP_NUM_THREADS from the actor's CPU share, which on a small machine is a fraction. A shard
whose part is already committed (a retry after the actor died past the commit) is not
generated again.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from astrai_batch.jobs.executors.ray_stages import shard_rows
from astrai_batch.jobs.executors.shard_run import run_shard
from astrai_batch.jobs.executors.shard_store import ShardInfo, ShardStore
from astrai_batch.jobs.job_adapters import load_job_adapters
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.records import records_table

RESULT_SCHEMA = pa.schema([pa.field("shard", pa.int64()), pa.field("info", pa.string())])


class ShardWorker:
    def __init__(
        self, config: JobConfig, store: ShardStore, part_schema: pa.Schema, threads: int
    ) -> None:
        from astrai_batch.engine import keep_freed_memory, load_model, set_cpu_threads

        set_cpu_threads(threads)
        keep_freed_memory()
        self.config = config
        self.store = store
        self.part_schema = part_schema
        self.loaded = load_model(config.model, **config.model_options())
        load_job_adapters(self.loaded, config)  # every worker reads them from their paths
        self.model: dict[str, Any] = {
            "name": self.loaded.name,
            "source": self.loaded.source,
            "architecture": self.loaded.architecture,
        }

    def __call__(self, batch: pa.Table) -> pa.Table:
        shard, rows = shard_rows(batch)
        if self.store.part(shard).exists():
            info = self.store.read_info(shard)
        else:
            if self.loaded.vision is not None:
                rows = self._with_images(rows)
            result = run_shard(self.loaded, self.config, rows)
            groups = {row.prefix_group for row in rows if row.prefix_group is not None}
            info = ShardInfo(shard, result.stats, len(groups), self.model)
            self.store.write(records_table(result.records, self.part_schema), info)
        return pa.Table.from_pylist(
            [{"shard": shard, "info": info.to_json()}], schema=RESULT_SCHEMA
        )

    def _with_images(self, rows: list) -> list:
        """Rows whose images load through this worker's processor (they came pickled
        without one, `ImageReload`), Parquet cells through one reader per shard."""
        import dataclasses

        from astrai_batch.io.image_cells import CellReader
        from astrai_batch.jobs.planning.image_encoding import with_processor

        processor, cells = self.loaded.vision.processor, CellReader()
        return [
            dataclasses.replace(row, images=with_processor(row.images, processor, cells))
            if row.images
            else row
            for row in rows
        ]
