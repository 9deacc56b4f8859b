"""Write a file so that readers see either nothing or the complete file, never a torn one.

Data goes to a hidden temporary file in the target's directory (same filesystem, so the final
rename is atomic). `commit` flushes, fsyncs the file, renames it over the target and fsyncs
the directory so the rename itself survives a crash; `abort` removes the temporary file and
leaves the target untouched. Without `overwrite`, an existing target is refused both when
the file is opened and again just before the rename.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
from pathlib import Path
from typing import BinaryIO

from astrai_batch.errors import OutputError


def temp_path_for(target: Path) -> Path:
    """`.{name}.tmp-{pid}-{random}` beside the target: unique per writer, hidden from globs."""
    return target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def refuse_existing(target: Path, overwrite: bool) -> None:
    if not overwrite and target.exists():
        raise OutputError(f"output {target} already exists; pass --overwrite to replace it")


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class AtomicFile:
    """A binary file that appears at `target` only on `commit`.

    States: open -> committed, or open -> aborted. `abort` after `commit` (or twice) does
    nothing, so callers can abort unconditionally in cleanup code.
    """

    def __init__(self, target: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        self.target = Path(target)
        self.overwrite = overwrite
        refuse_existing(self.target, overwrite)
        if not self.target.parent.is_dir():
            raise OutputError(f"output directory does not exist: {self.target.parent}")
        self.temp_path = temp_path_for(self.target)
        try:
            # O_EXCL: never reuse (and so never clobber) a file someone else created.
            descriptor = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise OutputError(
                f"cannot write in {self.target.parent}: {exc.strerror or exc}"
            ) from exc
        self.handle: BinaryIO = os.fdopen(descriptor, "wb")
        self.state = "open"

    def require_open(self) -> None:
        if self.state != "open":
            raise OutputError(f"output {self.target} is already {self.state}")

    def commit(self) -> None:
        """Flush, fsync, and atomically move the finished file onto the target."""
        self.require_open()
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            refuse_existing(self.target, self.overwrite)
            os.replace(self.temp_path, self.target)
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.target}: {exc.strerror or exc}") from exc
        except BaseException:
            self.abort()
            raise
        self.state = "committed"
        fsync_directory(self.target.parent)

    def abort(self) -> None:
        """Drop the temporary file; the target is left as it was."""
        if self.state != "open":
            return
        self.state = "aborted"
        self.handle.close()
        self.temp_path.unlink(missing_ok=True)

    def check_invariants(self) -> None:
        """Open: only the temp file exists for us. Committed/aborted: no temp file is left."""
        if self.state not in ("open", "committed", "aborted"):
            raise OutputError(f"writer for {self.target} is in unknown state {self.state!r}")
        if self.state == "open" and not self.temp_path.exists():
            raise OutputError(f"open writer lost its temporary file {self.temp_path}")
        if self.state != "open" and self.temp_path.exists():
            raise OutputError(f"{self.state} writer left {self.temp_path} behind")
        if self.state == "committed" and not self.target.exists():
            raise OutputError(f"committed writer but {self.target} is missing")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_paths(first: Path, second: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``):
    a reader of either name sees the old entry or the new one, never nothing. Returns False,
    having changed nothing, where the kernel, filesystem or libc cannot (the caller falls
    back to two renames)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        fsync_directory(first.parent)
        if second.parent != first.parent:
            fsync_directory(second.parent)
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(error, os.strerror(error), str(second))
