"""Peak resident memory of this process while one system runs.

The kernel's own peak (`ru_maxrss`) covers the whole process life, so after the first
system it would report the largest run so far rather than this one. On Linux the peak
(`VmHWM`) can be reset through `/proc/self/clear_refs`, which makes each run's peak exact;
elsewhere a sampling thread catches it to within one sampling interval. Both are used.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

SAMPLE_SECONDS = 0.02


class PeakRss:
    """`with PeakRss() as rss: ...` then `rss.peak_bytes`: the largest RSS sampled inside."""

    def __init__(self, interval_seconds: float = SAMPLE_SECONDS) -> None:
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds}")
        self._interval = interval_seconds
        try:
            import psutil  # absent on some GPU machines: /proc/self/statm does the same there
        except ImportError:
            self._process = None
        else:
            self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_bytes = 0
        self._kernel_reset = False

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._rss())

    def _rss(self) -> int:
        if self._process is not None:
            return self._process.memory_info().rss
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            return 0
        return pages * os.sysconf("SC_PAGE_SIZE")

    def _reset_kernel_peak(self) -> bool:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def _kernel_peak(self) -> int | None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._kernel_reset = self._reset_kernel_peak()
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
        kernel_peak = self._kernel_peak() if self._kernel_reset else None
        if kernel_peak is not None:
            self.peak_bytes = max(self.peak_bytes, kernel_peak)
