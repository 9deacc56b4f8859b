"""Finished shards of a sharded job: one atomic Parquet part per shard, beside the output.

Layout: the checkpoint directory ``.{output name}.ckpt`` (the same place a local run keeps
its checkpoint) on the output's filesystem, holding ``shard-{k}-of-{n}-{job}.parquet``
parts. `job` is a hash of the job's identity (input, model, result-affecting options,
number of shards), so a part can only ever be taken for the job that wrote it. A part is
written to a temporary object and committed whole; its key-value metadata carries the
shard's statistics, so a rerun knows everything about a finished shard without recomputing
it. A shard is done exactly when its part exists; a worker that dies before the commit
leaves nothing under the part's name, and the shard is simply run again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.errors import CheckpointError
from astrai_batch.io.filesystems import Location, write_table_at
from astrai_batch.jobs.output.checkpoint import RESTART_HINT
from astrai_batch.jobs.output.run_lock import LOCK_NAME
from astrai_batch.jobs.output.stats import WorkStats

PART_ROW_GROUP = 4096
SHARD_KEY = "astrai_batch.shard"
_PART = re.compile(r"^shard-(\d+)-of-(\d+)-([0-9a-f]+)\.parquet$")


def job_hash(identity: Mapping[str, Any]) -> str:
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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


@dataclass(frozen=True)
class ShardStore:
    directory: Location
    job: str
    shards: int

    def part(self, shard: int) -> Location:
        return self.directory.child(f"shard-{shard:04d}-of-{self.shards:04d}-{self.job}.parquet")

    def open(self, *, restart: bool) -> None:
        """Create the directory; refuse (or with `restart` remove) parts of another job. The
        run lock's file stays: the run holding it is the one calling this."""
        names = self.directory.list_names()
        foreign = [n for n in names if _PART.match(n) and not self._is_mine(n)]
        if foreign and not restart:
            raise CheckpointError(
                f"the checkpoint in {self.directory.shown} was made by a different job "
                f"(other input, model, options or number of workers); {RESTART_HINT}, or "
                "restore the original settings to resume"
            )
        for name in names:
            if name != LOCK_NAME and (restart or not self._is_mine(name)):
                self.directory.child(name).delete()
        self.directory.make_dir()

    def _is_mine(self, name: str) -> bool:
        match = _PART.match(name)
        return bool(match) and int(match[2]) == self.shards and match[3] == self.job  # type: ignore[index]

    def finished(self) -> dict[int, ShardInfo]:
        """The shards whose parts are committed, with what each reported."""
        done = {}
        for name in self.directory.list_names():
            if self._is_mine(name):
                info = self.read_info(int(_PART.match(name)[1]))  # type: ignore[index]
                done[info.shard] = info
        return done

    def read_info(self, shard: int) -> ShardInfo:
        part = self.part(shard)
        metadata = part.read_parquet_schema().metadata or {}
        value = metadata.get(SHARD_KEY.encode())
        if value is None:
            raise CheckpointError(f"checkpoint part {part.shown} lacks its shard statistics")
        return ShardInfo.from_json(value.decode())

    def write(self, table: pa.Table, info: ShardInfo) -> None:
        write_table_at(
            self.part(info.shard),
            table,
            metadata={SHARD_KEY: info.to_json()},
            overwrite=True,
            row_group_size=PART_ROW_GROUP,
        )

    def read_range(self, shard: int, columns: list[str], first: int, end: int) -> pa.Table:
        """Records of `shard` whose input index is in [first, end) (row groups skipped by
        their statistics, so reading a range costs about that range)."""
        from astrai_batch.jobs.output.records import INDEX_COLUMN

        part = self.part(shard)
        with part.open_input_file() as handle:
            return pq.read_table(
                handle,
                columns=columns,
                filters=[(INDEX_COLUMN, ">=", first), (INDEX_COLUMN, "<", end)],
            )

    def remove(self) -> None:
        self.directory.delete()
