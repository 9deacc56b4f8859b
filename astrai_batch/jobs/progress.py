"""Progress on stderr: a tqdm bar on a terminal, plain periodic lines otherwise, or nothing.

Progress never goes to stdout, which carries only the JSON summary (for Airflow's XCom).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

PREFIX = "astrai-batch"


@dataclass(frozen=True)
class ProgressSnapshot:
    """Where the job stands. `rows_done` includes rows restored from a checkpoint; rates
    count only this run's work."""

    rows_done: int
    total_rows: int
    rows_this_run: int
    generated_tokens: int
    prompt_tokens: int
    cached_tokens: int
    elapsed_seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at this run's row rate; None until the engine generated a token and a
        row of this run finished (rows that fail at once, before any step, measure nothing)."""
        if self.rows_this_run == 0 or self.generated_tokens == 0 or self.elapsed_seconds <= 0:
            return None
        remaining = max(self.total_rows - self.rows_done, 0)
        return remaining * self.elapsed_seconds / self.rows_this_run

    def line(self) -> str:
        """One plain-text progress line; the ETA once there is a rate to base it on."""
        share = self.rows_done / self.total_rows * 100 if self.total_rows else 100.0
        eta = self.eta_seconds
        eta_text = "" if eta is None else f", ETA {datetime.timedelta(seconds=round(eta))}"
        return (
            f"{PREFIX}: {self.rows_done}/{self.total_rows} rows ({share:.1f}%), "
            f"{self.tokens_per_second:.1f} generated tok/s, cache hit {self.hit_rate * 100:.1f}%"
            f"{eta_text}"
        )


class Progress:
    """Reports nothing; the base of the reporters (and what --quiet uses)."""

    def message(self, text: str) -> None:
        """A one-off note (model loaded, resuming, done)."""

    def update(self, snapshot: ProgressSnapshot) -> None:
        """Called after each finished row; reporters decide when to show something."""

    def close(self) -> None:
        """The job is over (finished, failed or interrupted)."""


class LogProgress(Progress):
    """A plain line every `interval` seconds of `clock` and one at the end."""

    def __init__(
        self, stream: TextIO, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self._next_report = clock() + interval
        self._last: ProgressSnapshot | None = None

    def message(self, text: str) -> None:
        self._write(f"{PREFIX}: {text}")

    def update(self, snapshot: ProgressSnapshot) -> None:
        self._last = snapshot
        now = self.clock()
        if now >= self._next_report:
            self._next_report = now + self.interval
            self._write(snapshot.line())

    def close(self) -> None:
        if self._last is not None:
            self._write(self._last.line())
            self._last = None

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


class BarProgress(Progress):
    """A tqdm bar: rows done of total, tokens per second, cache hit rate, ETA."""

    def __init__(self, stream: TextIO) -> None:
        from tqdm import tqdm

        self.stream = stream
        self._tqdm = tqdm
        self._bar: Any = None

    def message(self, text: str) -> None:
        self._tqdm.write(f"{PREFIX}: {text}", file=self.stream)

    def update(self, snapshot: ProgressSnapshot) -> None:
        if self._bar is None:
            self._bar = self._tqdm(
                total=snapshot.total_rows,
                initial=snapshot.rows_done - snapshot.rows_this_run,
                file=self.stream,
                unit="row",
                dynamic_ncols=True,
                smoothing=0.05,
            )
        self._bar.set_postfix(
            {"tok/s": f"{snapshot.tokens_per_second:.1f}", "hit": f"{snapshot.hit_rate:.1%}"},
            refresh=False,
        )
        # tqdm redraws at most every `mininterval` seconds, whatever the update rate.
        self._bar.update(snapshot.rows_done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def make_progress(stream: TextIO, *, quiet: bool, interval: float) -> Progress:
    """The reporter for `stream`: nothing when quiet, a bar on a terminal, else log lines."""
    if quiet:
        return Progress()
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return BarProgress(stream)
    return LogProgress(stream, interval)
