"""A job's time series for `astrai-batch report`: throughput, batch size and KV use over time.

A local run samples the engine's counters between steps (at most every `interval` seconds,
the interval doubling whenever the series would pass `MAX_POINTS`, two neighbours merged into
one), so the series stays a few kilobytes however long the job runs. It is saved in the
checkpoint's manifest with every part, so a resumed job's series goes on from where the killed
run's last save left it (runs are laid end to end: `end` counts job seconds, not wall-clock
time), and lands in the stats file's metadata (`TIMELINE_KEY`) when the output is written.
A Ray run records none (its workers' engines are not the driver's).
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from astrai_batch.engine.types import CacheStats, EngineStats

TIMELINE_KEY = "astrai_batch.timeline"
TIMELINE_FORMAT = 1
MAX_POINTS = 240
FIRST_INTERVAL = 0.5  # seconds between samples until the series first fills up


@dataclass(frozen=True)
class TimelinePoint:
    """One stretch of a run: its counters' differences, its gauges' highest sample."""

    run: int  # 0 for the first run of the job, 1 for the first resume, ...
    end: float  # job seconds at the stretch's end (earlier runs' time included)
    seconds: float  # the stretch's length
    rows: int  # rows done at its end (rows restored from a checkpoint included)
    decode_tokens: int  # tokens sampled in it
    steps: int  # engine steps in it
    kv_pages_in_use: int  # pages held by running sequences, the highest sample
    kv_cached_pages: int  # pages the prefix index holds (in use or not), the highest sample

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def batch(self) -> float:
        """Mean tokens sampled per engine step: the decode batch's mean occupancy."""
        return self.decode_tokens / self.steps if self.steps else 0.0

    def merged(self, later: TimelinePoint) -> TimelinePoint:
        return TimelinePoint(
            run=later.run,
            end=later.end,
            seconds=self.seconds + later.seconds,
            rows=later.rows,
            decode_tokens=self.decode_tokens + later.decode_tokens,
            steps=self.steps + later.steps,
            kv_pages_in_use=max(self.kv_pages_in_use, later.kv_pages_in_use),
            kv_cached_pages=max(self.kv_cached_pages, later.kv_cached_pages),
        )

    def to_list(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


_POINT_FIELDS = tuple(f.name for f in fields(TimelinePoint))


@dataclass(frozen=True)
class Timeline:
    """The series of one job (all its local runs) and what it is measured against."""

    kv_pages: int  # the KV pool's size in pages (the last run's)
    max_num_seqs: int
    interval: float  # seconds between samples now
    peak_rss_bytes: int  # the highest peak resident memory of any run's process
    points: tuple[TimelinePoint, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TIMELINE_FORMAT,
            "kv_pages": self.kv_pages,
            "max_num_seqs": self.max_num_seqs,
            "interval": self.interval,
            "peak_rss_bytes": self.peak_rss_bytes,
            "fields": list(_POINT_FIELDS),
            "points": [point.to_list() for point in self.points],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timeline:
        """Raises ValueError on anything but what `to_dict` writes."""
        keys = {"format", "kv_pages", "max_num_seqs", "interval", "peak_rss_bytes"}
        if not isinstance(data, Mapping) or set(data) != keys | {"fields", "points"}:
            raise ValueError(f"unexpected timeline keys {sorted(data)}")
        if data["format"] != TIMELINE_FORMAT or data["fields"] != list(_POINT_FIELDS):
            raise ValueError(f"unknown timeline format {data['format']!r}")
        points = []
        for item in data["points"]:
            if not isinstance(item, list) or len(item) != len(_POINT_FIELDS):
                raise ValueError(f"bad timeline point {item!r}")
            values = dict(zip(_POINT_FIELDS, item, strict=True))
            for name, value in values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"timeline point {name} is {value!r}")
            points.append(TimelinePoint(**values))
        return cls(
            kv_pages=int(data["kv_pages"]),
            max_num_seqs=int(data["max_num_seqs"]),
            interval=float(data["interval"]),
            peak_rss_bytes=int(data["peak_rss_bytes"]),
            points=tuple(points),
        )

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        return cls.from_dict(json.loads(text))

    @classmethod
    def checkpointed(cls, data: Any) -> Timeline | None:
        """The manifest's entry (None before any run recorded one); ValueError if damaged."""
        if data is None:
            return None
        try:
            return cls.from_dict(data)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"timeline: {exc}") from exc


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux counts KiB


class TimelineRecorder:
    """Samples one run's engine into a series that continues `previous` (a resumed job's)."""

    def __init__(
        self,
        previous: Timeline | None,
        *,
        kv_pages: int,
        max_num_seqs: int,
        clock: Callable[[], float],
        max_points: int = MAX_POINTS,
    ) -> None:
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        self.kv_pages = kv_pages
        self.max_num_seqs = max_num_seqs
        self.clock = clock
        self.max_points = max_points
        self.points: list[TimelinePoint] = list(previous.points) if previous else []
        self.interval = previous.interval if previous else FIRST_INTERVAL
        self.peak_rss = previous.peak_rss_bytes if previous else 0
        self.run = self.points[-1].run + 1 if self.points else 0
        self._offset = self.points[-1].end if self.points else 0.0
        self._started: float | None = None
        self._last_time = 0.0
        self._last: EngineStats | None = None
        self._kv_in_use = 0  # the highest gauges observed since the last sample
        self._kv_cached = 0

    def observe(self, cache: CacheStats) -> None:
        """Note the KV gauges between two samples (a sample alone could land when the
        batch has just drained, at a window's end)."""
        self._kv_in_use = max(self._kv_in_use, cache.pages_in_use)
        self._kv_cached = max(self._kv_cached, cache.cached_pages)

    def begin(self, stats: EngineStats) -> None:
        self._started = self._last_time = self.clock()
        self._last = stats

    def is_due(self) -> bool:
        return self._last is not None and self.clock() - self._last_time >= self.interval

    def sample(self, stats: EngineStats, rows_done: int, *, force: bool = False) -> None:
        """Record the stretch since the last sample, when `interval` has passed (or `force`)."""
        if self._last is None or self._started is None:
            return
        now = self.clock()
        if not force and now - self._last_time < self.interval:
            return
        delta = stats - self._last
        if now <= self._last_time and delta.steps == 0:
            return
        self.points.append(
            TimelinePoint(
                run=self.run,
                end=self._offset + now - self._started,
                seconds=max(now - self._last_time, 0.0),
                rows=rows_done,
                decode_tokens=delta.decode_tokens,
                steps=delta.steps,
                kv_pages_in_use=max(self._kv_in_use, stats.cache.pages_in_use),
                kv_cached_pages=max(self._kv_cached, stats.cache.cached_pages),
            )
        )
        self._kv_in_use = self._kv_cached = 0
        self._last, self._last_time = stats, now
        self.peak_rss = max(self.peak_rss, peak_rss_bytes())
        if len(self.points) > self.max_points:
            self._halve()

    def _halve(self) -> None:
        """Merge neighbours pairwise and sample half as often from now on."""
        merged = [
            self.points[i].merged(self.points[i + 1]) for i in range(0, len(self.points) - 1, 2)
        ]
        if len(self.points) % 2:
            merged.append(self.points[-1])
        self.points = merged
        self.interval *= 2

    def timeline(self) -> Timeline:
        return Timeline(
            kv_pages=self.kv_pages,
            max_num_seqs=self.max_num_seqs,
            interval=self.interval,
            peak_rss_bytes=self.peak_rss,
            points=tuple(self.points),
        )
