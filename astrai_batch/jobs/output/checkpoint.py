"""Checkpoints: finished result records saved beside the output, so a rerun resumes.

Layout: a hidden directory ``.{output name}.ckpt`` beside the output (on the output's
filesystem: a local disk or an object store, see `io.filesystems`), holding numbered part
files (``part-000001.parquet``, records in the part schema of `records`) and
``manifest.json``. Both kinds of file are written atomically (temporary file, fsync, rename;
on an object store a temporary object, then a move),
and a part counts only once the manifest lists it, so a crash at any moment leaves either the
old state or the new one; files the manifest does not list are removed when the checkpoint is
opened again (except the run lock's file, see `run_lock`: only the run holding that lock
opens the checkpoint).

The manifest records the job's identity (input content, model files, result options; see
`fingerprint`), its planning options (a resumed job plans as the checkpoint did), each
window's planning (first row, row count, prefix-group offset and count) and each part's
window and statistics. A window is complete when its parts hold all its rows; inside the
window the job is running, parts hold the rows that finished, in any order.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from astrai_batch.errors import CheckpointError, ConfigError, OutputError
from astrai_batch.io.filesystems import AtomicObject, Location, as_location, write_table_at
from astrai_batch.jobs.output.identity import job_differences
from astrai_batch.jobs.output.records import INDEX_COLUMN
from astrai_batch.jobs.output.run_lock import LOCK_NAME
from astrai_batch.jobs.output.stats import WorkStats, total
from astrai_batch.jobs.planning.prefix_order import PlanningOptions

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2  # 2: content identities, planning options kept with the job
RESTART_HINT = "rerun with --restart to discard it and start over"


_Place = TypeVar("_Place", Path, Location)


def checkpoint_dir_for(output: _Place) -> _Place:
    """The checkpoint directory of an output: hidden, beside it, on its filesystem."""
    name = f".{output.name}.ckpt"
    return output.sibling(name) if isinstance(output, Location) else output.parent / name


@dataclass(frozen=True)
class WindowRecord:
    """How a window was planned, so a resumed run can check it plans it the same way."""

    number: int
    start: int
    rows: int
    group_offset: int
    num_groups: int

    def to_dict(self) -> dict[str, int]:
        return {
            "number": self.number,
            "start": self.start,
            "rows": self.rows,
            "group_offset": self.group_offset,
            "num_groups": self.num_groups,
        }


@dataclass(frozen=True)
class PartRecord:
    file: str
    window: int
    stats: WorkStats


class Checkpoint:
    """The checkpoint of one job; create it with `Checkpoint.open`."""

    def __init__(self, directory: Location, manifest: Mapping[str, Any]) -> None:
        self.directory = directory
        try:
            self.run_id: str = manifest["run_id"]
            self.created: int = int(manifest["created"])
            self.job: dict[str, Any] = manifest["job"]
            self.planning = PlanningOptions.from_dict(manifest["planning"])
            self._windows = {
                int(item["number"]): WindowRecord(**item) for item in manifest["windows"]
            }
            self._parts = [
                PartRecord(item["file"], int(item["window"]), WorkStats.from_dict(item["stats"]))
                for item in manifest["parts"]
            ]
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise CheckpointError(
                f"checkpoint manifest in {directory.shown} is damaged ({exc!r}); {RESTART_HINT}"
            ) from exc

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path | Location,
        job: Mapping[str, Any],
        *,
        planning: PlanningOptions,
        restart: bool,
    ) -> Checkpoint:
        """Resume the checkpoint in `directory` if it belongs to `job`, else start a new one.

        An existing checkpoint of a different job is refused with `CheckpointError` listing
        what changed, unless `restart` is set, which discards it. A new checkpoint records
        `planning`; a resumed one keeps its own (`self.planning`), which the job then uses.
        The caller holds the output's `RunLock`.
        """
        job = json.loads(json.dumps(job))  # compare as stored: tuples are lists in JSON
        directory = as_location(directory)
        manifest_path = directory.child(MANIFEST_NAME)
        if restart:
            _remove_entries(directory, keep={LOCK_NAME})
        if manifest_path.exists():
            checkpoint = cls(directory, read_manifest(manifest_path))
            differences = job_differences(checkpoint.job, job)
            if differences:
                raise CheckpointError(
                    f"the checkpoint in {directory.shown} was made by a different job "
                    f"({'; '.join(differences)}); {RESTART_HINT}, or restore the original "
                    "settings to resume"
                )
            checkpoint._remove_unlisted_files()
            checkpoint._require_parts()
            return checkpoint
        # No manifest: nothing was ever saved (a crash right after creating the directory).
        try:
            directory.make_dir()
        except OSError as exc:
            raise OutputError(
                f"cannot create checkpoint {directory.shown}: {exc.strerror or exc}"
            ) from exc
        manifest = {
            "format": MANIFEST_FORMAT,
            "run_id": secrets.token_hex(8),
            "created": int(time.time()),
            "job": job,
            "planning": planning.to_dict(),
            "windows": [],
            "parts": [],
        }
        checkpoint = cls(directory, manifest)
        checkpoint._remove_unlisted_files()
        checkpoint._write_manifest()
        return checkpoint

    # -- what is done ------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self._parts

    def window(self, number: int) -> WindowRecord | None:
        return self._windows.get(number)

    def window_stats(self, number: int) -> WorkStats:
        return total(part.stats for part in self._parts if part.window == number)

    def stats_by_window(self) -> dict[int, WorkStats]:
        return {number: self.window_stats(number) for number in sorted(self._windows)}

    def total_stats(self) -> WorkStats:
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
        """Part files in writing order, of one window or of all."""
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
        self._parts.append(PartRecord(name, window, stats))
        self._write_manifest()

    def remove(self) -> None:
        self.directory.delete()

    def check_invariants(self) -> None:
        """Every listed part exists; no window holds more rows than it has."""
        self._require_parts()
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
            "job": self.job,
            "planning": self.planning.to_dict(),
            "windows": [self._windows[k].to_dict() for k in sorted(self._windows)],
            "parts": [
                {"file": part.file, "window": part.window, "stats": part.stats.to_dict()}
                for part in self._parts
            ],
        }

    def _write_manifest(self) -> None:
        manifest = AtomicObject(self.directory.child(MANIFEST_NAME), overwrite=True)
        try:
            manifest.handle.write(json.dumps(self._manifest(), indent=1).encode())
        except BaseException:
            manifest.abort()
            raise
        manifest.commit()

    def _remove_unlisted_files(self) -> None:
        listed = {part.file for part in self._parts} | {MANIFEST_NAME, LOCK_NAME}
        _remove_entries(self.directory, keep=listed)

    def _require_parts(self) -> None:
        for path in self.part_paths():
            if not path.is_file():
                raise CheckpointError(f"checkpoint part {path.shown} is missing; {RESTART_HINT}")


def _remove_entries(directory: Location, *, keep: set[str]) -> None:
    """Remove everything in `directory` except the names in `keep` (the run lock's file
    among them: the run that holds it is the one calling this)."""
    for name in directory.list_names():
        if name not in keep:
            directory.child(name).delete()


def read_manifest(path: Location) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot read checkpoint manifest {path.shown} ({exc}); {RESTART_HINT}"
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(
            f"checkpoint manifest {path.shown} has an unknown format; {RESTART_HINT}"
        )
    return manifest


def peek_run_id(directory: Location) -> str | None:
    """The run id of the checkpoint in `directory`, or None when there is no readable one."""
    try:
        manifest = json.loads(directory.child(MANIFEST_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    run_id = manifest.get("run_id") if isinstance(manifest, dict) else None
    return run_id if isinstance(run_id, str) else None
