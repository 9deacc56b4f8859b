"""The on-disk cache of converted models: where it lives, content hashes, atomic directory builds.

A cached directory is trusted only when it carries the completion marker. The marker is written
last, inside a temporary directory beside the target, and the directory is then renamed into
place, so a crash at any point leaves at most an untrusted temporary directory behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from astrai_batch.errors import ModelLoadError

CACHE_ENV_VAR = "ASTRAI_BATCH_CACHE"
COMPLETE_MARKER = "astrai-complete"
TEMP_PREFIX = ".tmp-"
HASH_INDEX_NAME = "sha256-index.json"
# An active build touches its temporary directory every few seconds; an hour of silence means
# the process that owned it is gone.
STALE_TEMP_AFTER_S = 3600.0
_HASH_CHUNK_BYTES = 1 << 20

logger = logging.getLogger(__name__)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: `cache_dir`, else `$ASTRAI_BATCH_CACHE`, else ~/.cache/astrai-batch."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from_env = os.environ.get(CACHE_ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    return Path.home() / ".cache" / "astrai-batch"


def file_sha256(path: Path, *, index_dir: Path | None = None) -> str:
    """The sha256 of a file's content, streamed in chunks.

    With `index_dir`, the digest is remembered by (resolved path, size, mtime) in a small JSON
    index there, so an unchanged file is hashed once. The index is only a shortcut: a missing,
    damaged or concurrently replaced index costs a re-hash, never a wrong answer for a file
    whose size or mtime changed.
    """
    resolved = path.resolve()
    stat = resolved.stat()
    key = str(resolved)
    index = _read_hash_index(index_dir) if index_dir is not None else {}
    entry = index.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("size") == stat.st_size
        and entry.get("mtime_ns") == stat.st_mtime_ns
        and isinstance(entry.get("sha256"), str)
    ):
        return str(entry["sha256"])
    digest = hashlib.sha256()
    with resolved.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    sha = digest.hexdigest()
    if index_dir is not None:
        index[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
        _write_json_atomically(index_dir / HASH_INDEX_NAME, index)
    return sha


def _read_hash_index(index_dir: Path) -> dict[str, object]:
    try:
        loaded = json.loads((index_dir / HASH_INDEX_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_json_atomically(path: Path, payload: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise


def is_complete(directory: Path) -> bool:
    """Whether `directory` is a finished cache entry (its completion marker is present)."""
    return (directory / COMPLETE_MARKER).is_file()


def build_dir_atomically(
    target: Path,
    build: Callable[[Path], None],
    *,
    stale_after_s: float = STALE_TEMP_AFTER_S,
) -> Path:
    """Return `target`, first building it with `build(temp_dir)` unless it is already complete.

    `build` fills an empty temporary directory beside `target`; the marker is added after it
    returns, everything is fsynced, and the directory is renamed onto `target`. If `build`
    raises, the temporary directory is removed and nothing is trusted. If another process
    finished `target` first, its copy is used and this one discarded.
    """
    if is_complete(target):
        return target
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(parent, stale_after_s=stale_after_s)
    _set_aside_incomplete(target)
    temp_dir = Path(tempfile.mkdtemp(dir=parent, prefix=f"{TEMP_PREFIX}{target.name}-"))
    try:
        build(temp_dir)
        (temp_dir / COMPLETE_MARKER).write_text(target.name + "\n", encoding="utf-8")
        _fsync_tree(temp_dir)
        try:
            os.rename(temp_dir, target)
        except OSError:
            if not is_complete(target):
                raise
            # Lost the race to a concurrent builder; its result is as good as ours.
            logger.info("cache entry %s was completed concurrently; using it", target)
            shutil.rmtree(temp_dir, ignore_errors=True)
            return target
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return target


def _set_aside_incomplete(target: Path) -> None:
    """Move an unmarked `target` (not something this module writes) out of the way."""
    if not target.exists() or is_complete(target):
        return
    aside = _temp_name_beside(target, "incomplete")
    try:
        os.rename(target, aside)
    except FileNotFoundError:
        return  # another process moved it first
    except OSError as err:
        raise ModelLoadError(
            f"Cache entry {target} exists but is incomplete and could not be moved aside; "
            "remove it and retry"
        ) from err
    # Under a temporary name nothing trusts it, and a failed removal is retried as stale later.
    shutil.rmtree(aside, ignore_errors=True)


def _temp_name_beside(target: Path, tag: str) -> Path:
    """A fresh name beside `target` that the cache treats as a temporary (never trusted)."""
    return target.parent / f"{TEMP_PREFIX}{target.name}-{tag}-{os.getpid()}-{time.time_ns()}"


def remove_stale_temp_dirs(parent: Path, *, stale_after_s: float = STALE_TEMP_AFTER_S) -> None:
    """Remove temporary entries under `parent` untouched for `stale_after_s` seconds."""
    now = time.time()
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue  # removed meanwhile
        if age < stale_after_s:
            continue
        logger.info("removing stale temporary cache entry %s", entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            fd = os.open(os.path.join(dirpath, filename), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
