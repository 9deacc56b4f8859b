"""One run per output on an object store: a lease object, since there is no flock there.

An object store has no lock that dies with its process, and pyarrow's filesystems have no
conditional write, so the run lock of a remote output is a *lease*: the object ``.lock``
in the checkpoint directory (where a local run keeps its flock file) holding the run's
random token, host, pid and the time it was last refreshed.

- `acquire`: a live lease refuses the run (`RunLockedError`, naming the holder) before
  anything else is touched. A lease is dead when it was not refreshed for `stale_seconds`
  (timings: `LeaseTiming`), or at once when its holder ran on this host and its process
  is gone (so a rerun after ``kill -9`` on the same machine resumes at once). Otherwise
  the run writes its own lease (temporary object, then move), waits `settle_seconds` and
  reads it back: a different token there means another run wrote after it and won; this
  run stops.
- While held, a thread rewrites the lease every `heartbeat_seconds` while it still holds
  this run's token. A lease found taken over is never taken back: `verify` then raises,
  and the run calls it before committing its output.
- `release` stops the thread and deletes the lease if it is still this run's (and the
  checkpoint directory with it when nothing else is in it).

What this guarantees is advisory, and weaker than the local flock: a check and a write are
two requests, so two runs that both read "no lease" before either wrote can both start when
one's write lands more than `settle_seconds` after the other's; a holder paused longer than
`stale_seconds` loses its lease and learns it at its next heartbeat; the machines' clocks
must agree to well within `stale_seconds`. Runs started one after the other, by people or
schedulers, are refused as locally.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from astrai_batch.errors import AstraiBatchError
from astrai_batch.io.filesystems import AtomicObject, Location
from astrai_batch.jobs.output.run_lock import LOCK_NAME, RunLockedError, process_alive


@dataclass(frozen=True)
class LeaseTiming:
    """How long a lease lives unrefreshed, how often its holder refreshes it, and how long a
    new holder waits before reading its lease back."""

    stale_seconds: float = 60.0
    heartbeat_seconds: float = 10.0
    settle_seconds: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_seconds < self.stale_seconds:
            raise ValueError(
                f"heartbeat_seconds must be > 0 and < stale_seconds ({self.stale_seconds}), "
                f"got {self.heartbeat_seconds}"
            )
        if self.settle_seconds < 0:
            raise ValueError(f"settle_seconds must be >= 0, got {self.settle_seconds}")


class LeaseLock:
    """The lease of one output's checkpoint directory on an object store."""

    def __init__(
        self, directory: Location, output_label: str, timing: LeaseTiming = LeaseTiming()
    ) -> None:
        self.directory = directory
        self.output_label = output_label
        self.timing = timing
        self._token: str | None = None
        self._lost: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def path(self) -> Location:
        return self.directory.child(LOCK_NAME)

    @property
    def held(self) -> bool:
        return self._token is not None

    def acquire(self) -> None:
        """Take the lease or raise `RunLockedError` naming the live holder."""
        if self._token is not None:
            raise RuntimeError("the run lock is already held")
        current = self.read()
        if current is not None and self._is_live(current):
            raise RunLockedError(self._held_message(current))
        token = secrets.token_hex(16)
        self._write(token)
        time.sleep(self.timing.settle_seconds)
        current = self.read()
        if current is None or current.get("token") != token:
            raise RunLockedError(self._held_message(current or {}))
        self._token = token
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="astrai-lease", daemon=True)
        self._beat.start()

    def verify(self) -> None:
        """Raise `RunLockedError` when another run took the lease over while this one ran."""
        if self._lost is not None:
            raise RunLockedError(
                f"{self._held_message(self._lost)}; it took over this run's lease (this run "
                "was paused or cut off for too long), so this run writes no output"
            )

    def release(self) -> None:
        """Stop refreshing; delete the lease if it is still ours, and then an empty
        checkpoint directory."""
        if self._token is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            current = self.read()
            if current is not None and current.get("token") == self._token:
                self.path.delete()
                if not self.directory.list_names() and self.directory.exists():
                    self.directory.delete()
        finally:
            self._token = None
            self._beat = None

    def read(self) -> dict[str, Any] | None:
        """The lease as stored, or None when there is none (or it is not one of ours)."""
        try:
            value = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # not written by this code: nothing to honour
        return value if isinstance(value, dict) else None

    def _write(self, token: str) -> None:
        lease = {
            "token": token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "refreshed": time.time(),
        }
        output = AtomicObject(self.path, overwrite=True)
        try:
            output.handle.write(json.dumps(lease).encode())
        except BaseException:
            output.abort()
            raise
        output.commit()

    def _is_live(self, lease: dict[str, Any]) -> bool:
        refreshed = lease.get("refreshed")
        if not isinstance(refreshed, (int, float)):
            return False
        if time.time() - refreshed > self.timing.stale_seconds:
            return False
        pid = lease.get("pid")
        if lease.get("host") == socket.gethostname() and isinstance(pid, int):
            return process_alive(pid)
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.timing.heartbeat_seconds):
            try:
                current = self.read()
                if current is None:
                    continue  # the run removed its checkpoint (it is finishing)
                if current.get("token") != self._token:
                    self._lost = current
                    return
                assert self._token is not None
                self._write(self._token)
            except (OSError, AstraiBatchError):
                continue  # a failed request: the next beat tries again

    def _held_message(self, lease: dict[str, Any]) -> str:
        pid, host = lease.get("pid"), lease.get("host")
        holder = f" (pid {pid} on {host})" if pid is not None and host else ""
        return f"another astrai-batch run{holder} is writing {self.output_label}"
