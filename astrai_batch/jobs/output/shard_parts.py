"""A Ray run's parts in the checkpoint: one atomic Parquet part per finished shard.

Named ``shard-{k}-of-{n}-{run_id}.parquet``: the checkpoint's run id proves the part is this
checkpoint's (a part of any other run is never taken, and never deleted without
``--restart``). A part is committed whole; its key-value metadata carries the shard's
statistics (`ShardInfo`), so a rerun knows everything about a finished shard without
recomputing it. A shard is done exactly when its part exists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.errors import CheckpointError
from astrai_batch.io.filesystems import Location
from astrai_batch.jobs.output.records import INDEX_COLUMN
from astrai_batch.jobs.output.stats import WorkStats

SHARD_KEY = "astrai_batch.shard"
SHARD_PART = re.compile(r"^shard-(\d+)-of-(\d+)-([0-9a-f]+)\.parquet$")


def shard_part_name(shard: int, shards: int, run_id: str) -> str:
    return f"shard-{shard:04d}-of-{shards:04d}-{run_id}.parquet"


@dataclass(frozen=True)
class ShardInfo:
    """What a finished shard reports: its counts, prefix groups and the model that ran it."""

    shard: int
    stats: WorkStats
    prefix_groups: int
    model: Mapping[str, Any]

    def to_json(self) -> str:
        return json.dumps(
            {
                "shard": self.shard,
                "stats": self.stats.to_dict(),
                "prefix_groups": self.prefix_groups,
                "model": dict(self.model),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ShardInfo:
        data = json.loads(text)
        return cls(
            data["shard"], WorkStats.from_dict(data["stats"]), data["prefix_groups"], data["model"]
        )


def shard_names(names: list[str], run_id: str, shards: int | None = None) -> dict[int, str]:
    """{shard: part name} of the parts of run `run_id` among `names` (of `shards` shards)."""
    found = {}
    for name in names:
        match = SHARD_PART.match(name)
        if match and match[3] == run_id and (shards is None or int(match[2]) == shards):
            found[int(match[1])] = name
    return found


def read_info(part: Location) -> ShardInfo:
    metadata = part.read_parquet_schema().metadata or {}
    value = metadata.get(SHARD_KEY.encode())
    if value is None:
        raise CheckpointError(f"checkpoint part {part.shown} lacks its shard statistics")
    return ShardInfo.from_json(value.decode())


def read_range(part: Location, columns: list[str], first: int, end: int) -> pa.Table:
    """Records of a part whose input index is in [first, end) (row groups skipped by their
    statistics, so reading a range costs about that range)."""
    with part.open_input_file() as handle:
        return pq.read_table(
            handle,
            columns=columns,
            filters=[(INDEX_COLUMN, ">=", first), (INDEX_COLUMN, "<", end)],
        )
