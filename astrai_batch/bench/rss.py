"""Peak resident memory of this process while one system runs.

The kernel's own peak (`ru_maxrss`) covers the whole process life, so after the first
system it would report the largest run so far rather than this one; a sampling thread
catches each run's own peak instead (to within one sampling interval).
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil

SAMPLE_SECONDS = 0.02


class PeakRss:
    """`with PeakRss() as rss: ...` then `rss.peak_bytes`: the largest RSS sampled inside."""

    def __init__(self, interval_seconds: float = SAMPLE_SECONDS) -> None:
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds}")
        self._interval = interval_seconds
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_bytes = 0

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
