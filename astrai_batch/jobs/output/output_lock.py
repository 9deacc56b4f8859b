"""The run lock of an output, whatever its filesystem: `lock_for` picks the kind.

A local output (or one on a shared POSIX filesystem mounted locally) gets the kernel's
`flock` (`run_lock.RunLock`: exclusive, dies with its process); an output on an object
store gets an advisory lease object (`lease_lock.LeaseLock`). Both refuse a second run
with the same words and before it touches anything; `verify` is called before an output
is committed (only a lease can be lost while a run holds it).
"""

from __future__ import annotations

from typing import Protocol

from astrai_batch.io.filesystems import Location
from astrai_batch.jobs.output.lease_lock import LeaseLock
from astrai_batch.jobs.output.run_lock import RunLock


class OutputLock(Protocol):
    def acquire(self) -> None: ...

    def verify(self) -> None: ...

    def release(self) -> None: ...


def lock_for(checkpoint: Location, output_label: str) -> OutputLock:
    """The lock of the output whose checkpoint directory is `checkpoint`."""
    if checkpoint.is_local:
        return RunLock(checkpoint.local_path, output_label)
    return LeaseLock(checkpoint, output_label)
