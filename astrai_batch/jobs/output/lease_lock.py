"""One run per output on an object store: a lease object, since there is no flock there.

An object store has no lock that dies with its process, and pyarrow's filesystems have no
conditional write, so the run lock of a remote output is a *lease*: the object ``.lock``
in the checkpoint directory (where a local run keeps its flock file) holding the run's
random token, host, pid, the machine's boot id and pid-namespace id, and the time it was
last refreshed.

- `acquire`: a live lease refuses the run (`RunLockedError`, naming the holder) before
  anything else is touched. Across hosts a lease is dead only when it was not refreshed for
  `stale_seconds` (timings: `LeaseTiming`). Its holder's pid is asked only when the lease
  was written in this very pid namespace of this very boot (same ``boot_id`` and
  ``/proc/self/ns/pid``): two containers share a hostname but not a pid namespace, and a
  pid of another namespace says nothing here. Then a gone process frees the lease at once
  (a rerun after ``kill -9`` on the same machine resumes at once). Otherwise the run writes
  its own lease, waits `settle_seconds` and reads it back: a different token there means
  another run wrote after it and won; this run stops.
- While held, a thread refreshes the lease every `heartbeat_seconds`: it re-reads the
  lease, and writes (one PUT of the object itself) only while it still holds this run's
  token and while its own last refresh is younger than `stale_seconds` (after that a
  newcomer may legitimately take over, so it writes no more). A lease found taken over is
  never taken back.
- `verify` re-reads the lease right before every commit and raises when it is not this
  run's (a different token, none at all, or one the heartbeat gave up).
- `release` stops the thread and deletes the lease if it is still this run's (and the
  checkpoint directory with it when nothing else is in it).

What this guarantees is advisory, and weaker than the local flock: a read and a write are
two requests. Two runs that both read "no lease" before either wrote can both start when
one's write lands more than `settle_seconds` after the other's. A heartbeat that re-read its
own token can still overwrite a newcomer whose lease lands between that read and its PUT
(only possible when the PUT lands after the old lease went stale); the newcomer then finds
a foreign token at its next heartbeat or `verify` and writes no output, so the two never
both commit unless `verify` and a commit race in the same window. The machines' clocks must
agree to well within `stale_seconds`. Runs started one after the other, by people or
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
from astrai_batch.io.filesystems import Location
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


def process_namespace() -> dict[str, str | None]:
    """This process's boot id and pid-namespace id (None where /proc does not tell): a pid
    means something here only for a holder that recorded the same two."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot_id: str | None = handle.read().strip() or None
    except OSError:
        boot_id = None
    try:
        pid_ns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = None
    return {"boot_id": boot_id, "pid_ns": pid_ns}


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
        # time.monotonic() before the last write that landed: others may call the lease
        # stale `stale_seconds` after it, so no write starts later than that.
        self._refreshed_at = 0.0
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
        self._lost = None
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="astrai-lease", daemon=True)
        self._beat.start()

    def verify(self) -> None:
        """Re-read the lease; raise `RunLockedError` unless it is still this run's."""
        if self._lost is None:
            current = self.read()
            if current is None or current.get("token") != self._token:
                self._lost = current or {}
        if self._lost:
            raise RunLockedError(
                f"{self._held_message(self._lost)}; it took over this run's lease (this run "
                "was paused or cut off for too long), so this run writes no output"
            )
        if self._lost is not None:
            raise RunLockedError(
                f"this run lost its lease on {self.output_label} (not refreshed for "
                f"{self.timing.stale_seconds:g}s, or removed), so it writes no output"
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
        """One PUT of the whole lease (an object store replaces an object atomically)."""
        started = time.monotonic()
        lease = {
            "token": token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **process_namespace(),
            "refreshed": time.time(),
        }
        with self.path.fs.open_output_stream(self.path.path, compression=None) as stream:
            stream.write(json.dumps(lease).encode())
        self._refreshed_at = started

    def _is_live(self, lease: dict[str, Any]) -> bool:
        refreshed = lease.get("refreshed")
        if not isinstance(refreshed, (int, float)):
            return False
        if time.time() - refreshed > self.timing.stale_seconds:
            return False
        pid = lease.get("pid")
        here = process_namespace()
        same_namespace = None not in here.values() and all(
            lease.get(key) == value for key, value in here.items()
        )
        if same_namespace and isinstance(pid, int):
            return process_alive(pid)
        return True

    def refresh(self) -> None:
        """One heartbeat: re-read, compare the token, then write; never after this run's
        own lease may have gone stale (a newcomer may hold it by then)."""
        if time.monotonic() - self._refreshed_at >= self.timing.stale_seconds:
            self._lost = {}
            return
        current = self.read()
        if current is None:
            return  # the run removed its checkpoint (it is finishing)
        if current.get("token") != self._token:
            self._lost = current
            return
        if time.monotonic() - self._refreshed_at >= self.timing.stale_seconds:
            self._lost = {}  # the read came back late: a newcomer may have written since
            return
        assert self._token is not None
        self._write(self._token)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.timing.heartbeat_seconds) and self._lost is None:
            try:
                self.refresh()
            except (OSError, AstraiBatchError):
                continue  # a failed request: the next beat tries again

    def _held_message(self, lease: dict[str, Any]) -> str:
        pid, host = lease.get("pid"), lease.get("host")
        holder = f" (pid {pid} on {host})" if pid is not None and host else ""
        return f"another astrai-batch run{holder} is writing {self.output_label}"
