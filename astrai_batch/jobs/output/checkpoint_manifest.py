"""The checkpoint's manifest: where it lives, what it records, which executor wrote it.

Layout: a hidden directory ``.{output name}.ckpt`` beside the output (on the output's
filesystem) holding ``manifest.json`` and the parts of finished rows. The manifest records
the job's identity, its planning options, the executor that owns the parts
(`ExecutorMark`), and for a local run each window's planning and each part's window and
statistics. Format 3 added the executor mark; a format-2 manifest is a local run's.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from astrai_batch.errors import CheckpointError
from astrai_batch.io.filesystems import AtomicObject, Location
from astrai_batch.jobs.output.run_lock import process_alive
from astrai_batch.jobs.output.stats import WorkStats

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 3  # 3: the executor mark; 2: content identities, planning kept with the job
READABLE_FORMATS = (2, 3)
RESTART_HINT = "rerun with --restart to discard it and start over"
LOCAL_PART = re.compile(r"^part-\d{6}\.parquet$")

_Place = TypeVar("_Place", Path, Location)


def checkpoint_dir_for(output: _Place) -> _Place:
    """The checkpoint directory of an output: hidden, beside it, on its filesystem."""
    name = f".{output.name}.ckpt"
    return output.sibling(name) if isinstance(output, Location) else output.parent / name


@dataclass(frozen=True)
class ExecutorMark:
    """Which executor's parts a checkpoint holds: ``local`` (window parts listed in the
    manifest) or ``ray`` (one part per shard of `shards`, planned by `sharding`)."""

    name: str
    shards: int | None = None
    sharding: int | None = None

    def __post_init__(self) -> None:
        if self.name not in ("local", "ray"):
            raise ValueError(f"unknown executor {self.name!r}")
        if (self.name == "ray") != (self.shards is not None):
            raise ValueError("a ray checkpoint has a shard count, a local one none")

    def describe(self) -> str:
        """The options that run this executor, as the user types them."""
        if self.name == "local":
            return "--executor local"
        return f"--executor ray --workers {self.shards}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shards": self.shards, "sharding": self.sharding}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ExecutorMark:
        if data is None:  # format 2: only local runs had checkpoints with a manifest
            return cls("local")
        return cls(str(data["name"]), data.get("shards"), data.get("sharding"))


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

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "window": self.window, "stats": self.stats.to_dict()}


def read_manifest(path: Location) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot read checkpoint manifest {path.shown} ({exc}); {RESTART_HINT}"
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") not in READABLE_FORMATS:
        raise CheckpointError(
            f"checkpoint manifest {path.shown} has an unknown format; {RESTART_HINT}"
        )
    return manifest


def write_manifest(directory: Location, manifest: Mapping[str, Any]) -> None:
    """Commit `manifest` atomically (a crash leaves the old one or the new one)."""
    from astrai_batch.jobs.crash_points import crash_point

    target = AtomicObject(directory.child(MANIFEST_NAME), overwrite=True)
    try:
        target.handle.write(json.dumps(dict(manifest), indent=1).encode())
    except BaseException:
        target.abort()
        raise
    target.commit()
    crash_point("manifest_written")


def peek_run_id(directory: Location) -> str | None:
    """The run id of the checkpoint in `directory`, or None when there is no readable one."""
    try:
        manifest = json.loads(directory.child(MANIFEST_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    run_id = manifest.get("run_id") if isinstance(manifest, dict) else None
    return run_id if isinstance(run_id, str) else None


def is_our_debris(name: str, listed: set[str]) -> bool:
    """A file in the checkpoint directory that a killed run of ours left and that holds no
    finished work: a local part the manifest does not list (written, never committed to the
    manifest), or a temporary file of one of our writers (``.{name}.tmp-...``). Shard parts
    of either run, the run lock's file and anything we cannot name are kept."""
    if LOCAL_PART.match(name):
        return name not in listed
    if name.startswith(".") and ".tmp-" in name:
        target = name[1:].split(".tmp-", 1)[0]
        return (
            target == MANIFEST_NAME or bool(LOCAL_PART.match(target)) or target.startswith("shard-")
        )
    return False


def new_manifest(job: Mapping[str, Any], planning: Any, executor: ExecutorMark) -> dict[str, Any]:
    """The manifest of a checkpoint nothing is saved in yet; `created` is the job's time
    (OpenAI lines carry it, however many runs the job takes)."""
    return {
        "format": MANIFEST_FORMAT,
        "run_id": secrets.token_hex(8),
        "created": int(time.time()),
        "executor": executor.to_dict(),
        "job": dict(job),
        "planning": planning.to_dict(),
        "windows": [],
        "parts": [],
    }


def remove_debris(directory: Location, listed: set[str]) -> None:
    """Remove what a killed run of ours left uncommitted (`is_our_debris`); a local temporary
    file whose writer (its pid is in the name) still runs is kept."""
    for name in directory.list_names():
        if is_our_debris(name, listed) and not _live_writer(directory, name):
            directory.child(name).delete()


def _live_writer(directory: Location, name: str) -> bool:
    # On an object store only the run holding the lock writes here.
    if not directory.is_local or ".tmp-" not in name:
        return False
    pid = name.split(".tmp-", 1)[1].split("-", 1)[0]
    return pid.isdigit() and process_alive(int(pid))
