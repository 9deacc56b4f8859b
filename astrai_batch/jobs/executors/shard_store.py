"""Where a Ray worker commits a finished shard: one atomic Parquet part in the job's
checkpoint (`output.shard_parts` names and reads them; `output.checkpoint` owns the
directory). The store is what travels to the workers: the checkpoint directory, its run id
and the shard count, enough to name and write a part and nothing that could delete one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from astrai_batch.io.filesystems import Location, write_table_at
from astrai_batch.jobs.crash_points import crash_point
from astrai_batch.jobs.output.shard_parts import (
    SHARD_KEY,
    ShardInfo,
    read_info,
    read_range,
    shard_part_name,
)

__all__ = ["PART_ROW_GROUP", "ShardInfo", "ShardStore"]

PART_ROW_GROUP = 4096


@dataclass(frozen=True)
class ShardStore:
    directory: Location
    run_id: str
    shards: int

    def part(self, shard: int) -> Location:
        return self.directory.child(shard_part_name(shard, self.shards, self.run_id))

    def read_info(self, shard: int) -> ShardInfo:
        return read_info(self.part(shard))

    def write(self, table: pa.Table, info: ShardInfo) -> None:
        write_table_at(
            self.part(info.shard),
            table,
            metadata={SHARD_KEY: info.to_json()},
            overwrite=True,
            row_group_size=PART_ROW_GROUP,
        )
        crash_point("shard_written")

    def read_range(self, shard: int, columns: list[str], first: int, end: int) -> pa.Table:
        return read_range(self.part(shard), columns, first, end)
