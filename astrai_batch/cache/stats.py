"""A snapshot of KV-cache counters and gauges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from astrai_batch.errors import ConfigError

_COUNTERS = ("lookups", "hit_tokens", "missed_tokens", "inserted_pages", "evicted_pages")


@dataclass(frozen=True)
class CacheStats:
    """Counters (`lookups` .. `evicted_pages`) grow over the cache's life; gauges
    (`pages_in_use`, `cached_pages`, `peak_pages_in_use`) describe it at snapshot time.

    `later - earlier` gives the counters of the run between two snapshots with `later`'s
    gauges, so a job sharing a long-lived cache can report its own numbers.

    A lookup is counted once per request, when it is admitted (its first successful
    `reserve`): `hit_tokens` are the prompt tokens it found cached, `missed_tokens` the rest.
    An admission refused for want of pages and a preempted request's return count nothing, so
    `hit_tokens` equals the sum of the rows' cached tokens.
    """

    lookups: int = 0
    hit_tokens: int = 0
    missed_tokens: int = 0
    inserted_pages: int = 0
    evicted_pages: int = 0
    pages_in_use: int = 0
    cached_pages: int = 0
    peak_pages_in_use: int = 0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{field.name} must be a non-negative integer, got {value!r}")

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens served from the cache (0.0 before any lookup)."""
        looked_up = self.hit_tokens + self.missed_tokens
        return self.hit_tokens / looked_up if looked_up else 0.0

    def __sub__(self, earlier: CacheStats) -> CacheStats:
        if not isinstance(earlier, CacheStats):
            return NotImplemented
        values = asdict(self)
        for name in _COUNTERS:
            values[name] -= getattr(earlier, name)
        return CacheStats(**values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheStats:
        """Inverse of `to_dict`: `hit_rate` is derived and ignored; other unknown keys raise."""
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(data) - known - {"hit_rate"})
        if unknown:
            raise ConfigError(f"unknown CacheStats keys: {', '.join(unknown)}")
        return cls(**{name: value for name, value in data.items() if name in known})

    def to_dict(self) -> dict[str, int | float]:
        """All fields plus `hit_rate`, ready for JSON."""
        return {**asdict(self), "hit_rate": self.hit_rate}
