"""Rank 0's handle on the other ranks' processes: start, wait until ready, diagnose, end.

Each rank is `python -m astrai_batch.engine.parallel.worker`, its `WorkerSpec` pickled on its
stdin, which stays open: the worker takes EOF on it (rank 0 gone, however it died) as the
order to exit, and on Linux also asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG;
only when started from the main thread, since the signal follows the starting thread).
A worker's stderr goes to an unlinked temporary file (nothing is left behind, even when rank
0 is killed), whose last line of the worker's own names what went wrong when it dies.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_batch.errors import RankFailureError

_EXIT_GRACE_S = 10.0  # a stopping worker's time to leave by itself before it is killed
_DEATH_WAIT_S = 2.0  # after a broken collective, how long a dying peer gets to be reaped
_LOG_TAIL = 1 << 16  # bytes of a worker's stderr read for its last words


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    world_size: int
    port: int
    model_dir: str
    model_name: str
    dtype: str
    device: str
    timeout_s: float
    trust_remote_code: bool
    max_model_len: int
    threads: int
    parent_pid: int
    die_with_parent: bool


class RankProcesses:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._procs: dict[int, subprocess.Popen] = {}
        self._logs: dict[int, Any] = {}

    def start(self, spec: WorkerSpec) -> None:
        log = tempfile.TemporaryFile(prefix="astrai-tp-")  # noqa: SIM115 (closed in stop)
        self._logs[spec.rank] = log
        proc = subprocess.Popen(
            [sys.executable, "-m", "astrai_batch.engine.parallel.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # a terminal's Ctrl-C goes to rank 0, which ends us
        )
        self._procs[spec.rank] = proc
        data = pickle.dumps(spec)
        proc.stdin.write(len(data).to_bytes(8, "little") + data)
        proc.stdin.flush()

    def wait_ready(self, timeout_s: float) -> None:
        """Each worker writes one byte once it is running; a worker that dies before is
        reported at once, not after the rendezvous' timeout."""
        waiting = {proc.stdout.fileno(): rank for rank, proc in self._procs.items()}
        deadline = time.monotonic() + timeout_s
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = ", ".join(str(r) for r in sorted(waiting.values()))
                raise RankFailureError(
                    f"tensor-parallel rank {ranks} did not start within {timeout_s:g} s"
                )
            ready, _, _ = select.select(list(waiting), [], [], min(left, 0.5))
            for fd in ready:
                rank = waiting.pop(fd)
                if not os.read(fd, 1):
                    raise RankFailureError(self.describe_failure())
            for rank in list(waiting.values()):
                if self._procs[rank].poll() is not None:
                    raise RankFailureError(self.describe_failure())

    def describe_failure(self, err: BaseException | None = None, timeout_s: float = 0) -> str:
        """One line naming the rank that failed: a dead one (its exit or signal and its last
        words), else a stopped one, else the ones that did not answer."""
        deadline = time.monotonic() + _DEATH_WAIT_S
        while True:
            dead = {r: p.returncode for r, p in self._procs.items() if p.poll() is not None}
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if dead:
            rank = min(dead, key=lambda r: (dead[r] >= 0, r))  # a signal first: the cause
            code = dead[rank]
            how = (
                f"was killed by {signal.Signals(-code).name}"
                if code < 0
                else f"exited with status {code}"
            )
            last = self._last_words(rank)
            return f"tensor-parallel rank {rank} {how}" + (f": {last}" if last else "")
        stopped = [r for r, p in self._procs.items() if _state(p.pid) == "T"]
        waited = f" within {timeout_s:g} s" if timeout_s else ""
        if stopped:
            names = ", ".join(str(r) for r in stopped)
            return f"tensor-parallel rank {names} is stopped and did not answer{waited}"
        names = ", ".join(str(r) for r in sorted(self._procs))
        detail = f" ({str(err).splitlines()[0][:200]})" if err is not None else ""
        return f"tensor-parallel rank {names} did not answer{waited}{detail}"

    def stop(self, *, graceful: bool) -> None:
        """Ends every worker (waits for a graceful exit first when asked) and reaps it."""
        if graceful:
            deadline = time.monotonic() + _EXIT_GRACE_S
            for proc in self._procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()  # SIGKILL also ends a stopped process
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self._procs.clear()
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    @property
    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self._procs.items()}

    def _last_words(self, rank: int) -> str:
        """The worker's own one-line error (`worker.main`), not a library's warnings."""
        fd = self._logs[rank].fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - _LOG_TAIL)
        # pread: the worker shares the file offset, which must not move under it
        lines = os.pread(fd, size - start, start).decode(errors="replace").splitlines()
        ours = [line for line in lines if line.startswith(f"rank {rank}: ")]
        return ours[-1].removeprefix(f"rank {rank}: ")[:300] if ours else ""


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped); '' where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[0]


def started_from_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
