"""Checkpoints: finished result records saved beside the output, so a rerun resumes.

One format for both executors (`checkpoint_manifest`): the manifest names the job, its
planning and the executor that owns the parts. A local run saves numbered window parts
(``part-000001.parquet``), each counting once the manifest lists it; a Ray run's workers
commit one part per shard (`shard_parts`), each counting once it exists under the
checkpoint's run id. Every file is written atomically, so a crash at any moment leaves the
old state or the new one.

A checkpoint is resumed by the executor that wrote it (`checkpoint_opening`). The other
executor takes it over only while it holds no finished rows; otherwise it is refused with a
one-line message naming the executor that resumes it and ``--restart``. Nothing in it is
deleted without ``--restart`` except our own uncommitted debris (`is_our_debris`). Inside a
local window parts hold the rows that finished, in any order; a window is complete when its
parts hold all its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from astrai_batch.errors import CheckpointError, ConfigError
from astrai_batch.io.filesystems import Location, write_table_at
from astrai_batch.jobs.crash_points import crash_point
from astrai_batch.jobs.output.checkpoint_manifest import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    RESTART_HINT,
    ExecutorMark,
    PartRecord,
    WindowRecord,
    checkpoint_dir_for,
    peek_run_id,
    remove_debris,
    write_manifest,
)
from astrai_batch.jobs.output.records import INDEX_COLUMN
from astrai_batch.jobs.output.run_lock import LOCK_NAME
from astrai_batch.jobs.output.shard_parts import ShardInfo, read_info, shard_names
from astrai_batch.jobs.output.stats import WorkStats, total
from astrai_batch.jobs.output.timeline import Timeline
from astrai_batch.jobs.planning.prefix_order import PlanningOptions

__all__ = [
    "RESTART_HINT",
    "Checkpoint",
    "ExecutorMark",
    "PartRecord",
    "WindowRecord",
    "checkpoint_dir_for",
    "peek_run_id",
]


class Checkpoint:
    """The checkpoint of one job; open it with `checkpoint_opening.open_checkpoint`."""

    def __init__(self, directory: Location, manifest: Mapping[str, Any]) -> None:
        self.directory = directory
        try:
            self.run_id: str = manifest["run_id"]
            self.created: int = int(manifest["created"])
            self.job: dict[str, Any] = manifest["job"]
            self.planning = PlanningOptions.from_dict(manifest["planning"])
            self.executor = ExecutorMark.from_dict(manifest.get("executor"))
            self._windows = {
                int(item["number"]): WindowRecord(**item) for item in manifest["windows"]
            }
            self._parts = [
                PartRecord(item["file"], int(item["window"]), WorkStats.from_dict(item["stats"]))
                for item in manifest["parts"]
            ]
            # the report's time series (`timeline`), saved with each part of a local run
            self.timeline: Timeline | None = Timeline.checkpointed(manifest.get("timeline"))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise CheckpointError(
                f"checkpoint manifest in {directory.shown} is damaged ({exc!r}); {RESTART_HINT}"
            ) from exc

    def restart_as(
        self, job: dict[str, Any], planning: PlanningOptions, executor: ExecutorMark
    ) -> None:
        """Make this checkpoint, which holds no finished rows, another job's or executor's."""
        self.job, self.planning, self.executor = job, planning, executor
        self._windows = {}
        self.timeline = None
        self.save_manifest()

    # -- what is done ------------------------------------------------------------------------

    def has_finished_rows(self) -> bool:
        return bool(self._parts) or bool(self.shard_infos())

    @property
    def is_empty(self) -> bool:
        return not self.has_finished_rows()

    def shard_infos(self) -> dict[int, ShardInfo]:
        """The committed shard parts of this checkpoint's run, with what each reported."""
        names = shard_names(self.directory.list_names(), self.run_id, self.executor.shards)
        return {shard: read_info(self.directory.child(name)) for shard, name in names.items()}

    def shard_part(self, shard: int) -> Location:
        from astrai_batch.jobs.output.shard_parts import shard_part_name

        return self.directory.child(shard_part_name(shard, self.executor.shards or 0, self.run_id))

    def window(self, number: int) -> WindowRecord | None:
        return self._windows.get(number)

    def window_stats(self, number: int) -> WorkStats:
        return total(part.stats for part in self._parts if part.window == number)

    def stats_by_window(self) -> dict[int, WorkStats]:
        """Statistics per window (a local run) or per shard (a Ray run)."""
        if self.executor.name == "ray":
            infos = self.shard_infos()
            return {shard: infos[shard].stats for shard in sorted(infos)}
        return {number: self.window_stats(number) for number in sorted(self._windows)}

    def total_stats(self) -> WorkStats:
        if self.executor.name == "ray":
            return total(info.stats for info in self.shard_infos().values())
        return total(part.stats for part in self._parts)

    def is_window_complete(self, number: int) -> bool:
        record = self._windows.get(number)
        return record is not None and self.window_stats(number).input_rows == record.rows

    def first_incomplete_window(self) -> int:
        number = 0
        while self.is_window_complete(number):
            number += 1
        return number

    def group_offset(self, number: int) -> int:
        """The first prefix-group id of window `number` (every earlier window is recorded)."""
        record = self._windows.get(number)
        if record is not None:
            return record.group_offset
        earlier = [self._windows.get(k) for k in range(number)]
        if any(item is None for item in earlier):
            raise CheckpointError(
                f"checkpoint in {self.directory.shown} lacks windows before {number}"
            )
        return sum(item.num_groups for item in earlier if item is not None)

    def done_indices(self, number: int) -> set[int]:
        """Input indices of window `number` whose records are saved."""
        done: set[int] = set()
        for path in self.part_paths(number):
            table = path.read_parquet([INDEX_COLUMN])
            done.update(table.column(INDEX_COLUMN).to_pylist())
        return done

    def first_error(self) -> tuple[int, str] | None:
        """(input index, message) of the earliest failed row saved, or None."""
        first: tuple[int, str] | None = None
        for path in self.part_paths():
            table = path.read_parquet([INDEX_COLUMN, "finish_reason", "error"])
            for index, reason, error in zip(
                *(table.column(name).to_pylist() for name in table.column_names), strict=True
            ):
                if reason == "error" and (first is None or index < first[0]):
                    first = (index, error or "")
        return first

    def part_paths(self, window: int | None = None) -> list[Location]:
        """Part files: a local run's in writing order (of one window or of all), or a Ray
        run's shard parts in shard order."""
        if self.executor.name == "ray" and window is None:
            return [self.shard_part(shard) for shard in sorted(self.shard_infos())]
        return [
            self.directory.child(part.file)
            for part in self._parts
            if window is None or part.window == window
        ]

    def parts(self) -> tuple[PartRecord, ...]:
        return tuple(self._parts)

    def windows(self) -> list[int]:
        return sorted(self._windows)

    # -- saving ---------------------------------------------------------------------------------

    def record_window(self, record: WindowRecord) -> None:
        """Remember a window's planning; saved with its first part. A recorded window must be
        planned identically on every run."""
        known = self._windows.get(record.number)
        if known is not None and known != record:
            raise CheckpointError(
                f"window {record.number} was planned as {known.to_dict()} before but as "
                f"{record.to_dict()} now; {RESTART_HINT}"
            )
        self._windows[record.number] = record

    def write_part(self, window: int, table: pa.Table, stats: WorkStats) -> None:
        """Save a table of finished records of `window`, then list it in the manifest."""
        if window not in self._windows:
            raise CheckpointError(f"window {window} must be recorded before its parts")
        name = f"part-{len(self._parts) + 1:06d}.parquet"
        write_table_at(self.directory.child(name), table)
        crash_point("part_written")
        self._parts.append(PartRecord(name, window, stats))
        self.save_manifest()

    def remove(self) -> None:
        """Delete the checkpoint, its manifest last: until the manifest goes, a rerun after a
        kill here can tell that the output beside it is this checkpoint's. Only files it
        wrote go (`checkpoint_discard.our_files`); the directory goes when nothing else is
        in it."""
        from astrai_batch.jobs.output.checkpoint_discard import our_files

        names = self.directory.list_names()
        for name in our_files(self.directory, names, self.run_id):
            if name != MANIFEST_NAME:
                self.directory.child(name).delete()
        self.directory.child(MANIFEST_NAME).delete()
        if set(self.directory.list_names()) <= {LOCK_NAME}:
            self.directory.delete()

    def check_invariants(self) -> None:
        """Every listed part exists; no window holds more rows than it has."""
        self.require_parts()
        for number in self._windows:
            done = self.window_stats(number).input_rows
            if done > self._windows[number].rows:
                raise CheckpointError(
                    f"window {number} has {done} saved rows of {self._windows[number].rows}"
                )
        orphans = [part.file for part in self._parts if part.window not in self._windows]
        if orphans:
            raise CheckpointError(f"parts {orphans} belong to no recorded window")

    # -- files ----------------------------------------------------------------------------------

    def _manifest(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "run_id": self.run_id,
            "created": self.created,
            "executor": self.executor.to_dict(),
            "job": self.job,
            "planning": self.planning.to_dict(),
            "windows": [self._windows[k].to_dict() for k in sorted(self._windows)],
            "parts": [part.to_dict() for part in self._parts],
        } | ({} if self.timeline is None else {"timeline": self.timeline.to_dict()})

    def save_manifest(self) -> None:
        write_manifest(self.directory, self._manifest())

    def remove_debris(self) -> None:
        remove_debris(self.directory, {part.file for part in self._parts})

    def require_parts(self) -> None:
        for path in self.part_paths():
            if not path.is_file():
                raise CheckpointError(f"checkpoint part {path.shown} is missing; {RESTART_HINT}")
