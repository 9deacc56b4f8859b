"""SIGINT / SIGTERM during a job: stop at once, keep what finished, exit 128 + signal.

The watcher cancels the job's cancel scope on the first signal; the runner then saves the
finished rows to the checkpoint and reports the job as interrupted. Rows still generating
are dropped (the checkpoint only ever holds complete rows) and rerunning resumes. Once the
watcher has fired, the default handlers are back, so a second Ctrl-C stops even the flush
(which is atomic, so that too is safe).
"""

from __future__ import annotations

import signal

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
