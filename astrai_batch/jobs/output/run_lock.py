"""One run per output: an exclusive OS lock on the checkpoint directory for the whole run.

Two runs on one output (an overlapping cron run, a retry while the first is alive) would
share the checkpoint directory: each would remove the other's temporary files, part names
would collide and the last manifest written would win. So a run takes `fcntl.flock`
(exclusive, non-blocking) on ``LOCK_NAME`` inside the directory before it touches anything,
writes its pid into it, and holds it until it ends. A second run finds the lock taken and
stops at once, naming the holder's pid, having changed nothing.

The kernel drops a flock when its process dies, however it dies, so a rerun after
``kill -9`` takes the lock and resumes. The lock file stays with the checkpoint; a run that
saved nothing (refused before its checkpoint opened, or finished) removes it with the
directory while it still holds the lock.

This lock is for outputs on a local (or locally mounted) filesystem; an output on an object
store gets an advisory lease instead (`lease_lock`; `output_lock.lock_for` picks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from astrai_batch.errors import OutputError

LOCK_NAME = ".lock"
# How long a loser waits for the holder to write its pid (it does so right after locking).
_PID_WAIT_SECONDS = 1.0


class RunLockedError(OutputError):
    """Another live run holds the output's lock."""


class RunLock:
    """The lock of one output's checkpoint directory; `acquire`, then `release` when done."""

    def __init__(self, directory: Path, output_label: str) -> None:
        self.directory = directory
        self.output_label = output_label
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise `RunLockedError` naming the holder; creates the directory
        when it does not exist (`release` removes it again when nothing was saved)."""
        if self._fd is not None:
            raise RuntimeError("the run lock is already held")
        while True:
            self._make_directory()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue  # the directory was removed by a run that just finished
            except OSError as exc:
                raise OutputError(f"cannot create {self.path}: {exc.strerror or exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLockedError(self._held_message()) from None
            if self._is_current(fd):
                break
            # We locked a lock file that its finishing holder removed: lock the new one.
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def verify(self) -> None:
        """Nothing to check: the kernel keeps a flock for as long as its process lives."""

    def release(self) -> None:
        """Give the lock up. If the directory holds nothing but the lock file, remove both
        first (still holding the lock, so no other run can be using them)."""
        if self._fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                names = os.listdir(self.directory)
                if names == [LOCK_NAME]:
                    self.path.unlink()
                    self.directory.rmdir()
        finally:
            os.close(self._fd)
            self._fd = None

    def _make_directory(self) -> None:
        try:
            self.directory.mkdir()
        except FileExistsError:
            pass
        except OSError as exc:
            raise OutputError(
                f"cannot create checkpoint {self.directory}: {exc.strerror or exc}"
            ) from exc

    def _is_current(self, fd: int) -> bool:
        """Whether the locked file is still the one at `path` (not unlinked meanwhile)."""
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def _held_message(self) -> str:
        pid = self._holder_pid()
        holder = f" (pid {pid})" if pid is not None else ""
        return f"another astrai-batch run{holder} is writing {self.output_label}"

    def _holder_pid(self) -> int | None:
        deadline = time.monotonic() + _PID_WAIT_SECONDS
        while True:
            try:
                text = self.path.read_text().strip()
            except OSError:
                text = ""
            if text.isdigit():
                return int(text)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
