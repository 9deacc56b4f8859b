"""SIGINT / SIGTERM during a job: stop at once, keep what finished, exit 128 + signal.

The watcher cancels the job's cancel scope on the first signal; the runner then saves the
finished rows to the checkpoint and reports the job as interrupted. Rows still generating
are dropped (the checkpoint only ever holds complete rows) and rerunning resumes. Once the
watcher has fired, the default handlers are back, so a second Ctrl-C stops even the flush
(which is atomic, so that too is safe).
"""

from __future__ import annotations

import signal
import threading

import anyio
from anyio import CancelScope
from anyio.abc import TaskStatus

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupt_exit_code(signum: int) -> int:
    """The shell convention: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


class SignalWatcher:
    """Records the first interrupting signal and cancels `scope` when it arrives."""

    def __init__(self) -> None:
        self.signum: int | None = None

    async def watch(
        self, scope: CancelScope, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run as a task (`await tg.start(watcher.watch, scope)`): handlers are installed
        when `start` returns."""
        with anyio.open_signal_receiver(*INTERRUPT_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                self.signum = int(signum)
                scope.cancel()
                return


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived outside the executor's run (while the input opens, the model
    loads, the checkpoint opens or the output is written). A BaseException, so no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class InterruptGuard:
    """Outside the executor's run, SIGINT and SIGTERM raise `Interrupted` in the main thread,
    so the job ends the way an interrupted run does (a summary, a checkpoint worth resuming
    or nothing) instead of dying with the default SIGTERM action. The first signal puts the
    default handlers back, so a second one stops even the clean-up. Outside the main
    thread (a library caller's worker) signals never reach us and nothing is installed.

    The executor's event loop installs handlers of its own (`SignalWatcher`) and leaves the
    defaults behind when it ends: call `install` again after it."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.getsignal(signum) for signum in INTERRUPT_SIGNALS}
            self.install()
        return self

    def install(self) -> None:
        if self._previous:
            for signum in INTERRUPT_SIGNALS:
                signal.signal(signum, self._raise)

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _raise(self, signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Interrupted(signum)
