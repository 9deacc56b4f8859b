"""The engine core's own counters: steps, sampled tokens, and where its time went."""

from __future__ import annotations

from astrai_batch.engine.runner.forward_timer import ForwardTimer


class StepCounters:
    """A step's forward timer is kept unread until its sampled tokens have been read: on CUDA
    that read waited for this forward (and every earlier one), so reading the timers then
    costs no synchronization."""

    __slots__ = ("_unread", "busy_seconds", "decode_tokens", "forward_seconds", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.decode_tokens = 0
        self.forward_seconds = 0.0
        self.busy_seconds = 0.0
        self._unread: list[ForwardTimer] = []

    def forward_done(self, timer: ForwardTimer) -> None:
        self.steps += 1
        self._unread.append(timer)

    def read_timers(self) -> None:
        for timer in self._unread:
            self.forward_seconds += timer.seconds()
        self._unread.clear()
