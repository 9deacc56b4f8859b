"""Timing a model forward honestly on any device.

On CUDA a forward returns as soon as its kernels are queued, so a wall clock around it
measures launches. CUDA events recorded before and after are read only when asked, after the
step's one synchronization (reading the sampled tokens) has made the end event complete, so
timing adds no synchronization to a step; asking earlier waits for the end event.
"""

from __future__ import annotations

import time

import torch


class ForwardTimer:
    """`start()`, `stop()`, then `seconds()` (device time on CUDA, wall time elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
        self._started = 0.0
        self._wall: float | None = None

    def start(self) -> None:
        if self._cuda:
            self._begin.record()
        self._started = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._end.record()
        self._wall = time.perf_counter() - self._started

    def seconds(self) -> float:
        if self._wall is None:
            raise RuntimeError("the forward timer was read before it was stopped")
        if self._cuda:
            self._end.synchronize()
            return self._begin.elapsed_time(self._end) / 1000.0
        return self._wall
