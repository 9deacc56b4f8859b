from __future__ import annotations

import pytest

from astrai_batch.cache import CacheStats
from astrai_batch.errors import ConfigError


def test_hit_rate_is_the_share_of_looked_up_tokens_served_from_cache() -> None:
    assert CacheStats(hit_tokens=8, missed_tokens=24).hit_rate == 0.25
    assert CacheStats().hit_rate == 0.0


def test_subtraction_gives_the_counters_of_a_run_and_the_later_gauges() -> None:
    before = CacheStats(1, 2, 3, 4, 5, pages_in_use=6, cached_pages=7, peak_pages_in_use=8)
    after = CacheStats(11, 12, 13, 14, 15, pages_in_use=1, cached_pages=2, peak_pages_in_use=9)
    assert after - before == CacheStats(10, 10, 10, 10, 10, 1, 2, 9)


def test_subtracting_a_later_snapshot_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^lookups must be a non-negative integer, got -1$"):
        CacheStats(lookups=1) - CacheStats(lookups=2)


def test_to_dict_round_trips_and_includes_the_hit_rate() -> None:
    stats = CacheStats(3, 6, 2, 1, 0, 4, 5, 6)
    data = stats.to_dict()
    assert data == {
        "lookups": 3,
        "hit_tokens": 6,
        "missed_tokens": 2,
        "inserted_pages": 1,
        "evicted_pages": 0,
        "pages_in_use": 4,
        "cached_pages": 5,
        "peak_pages_in_use": 6,
        "hit_rate": 0.75,
    }
    assert CacheStats.from_dict(data) == stats


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"^unknown CacheStats keys: hits, misses$"):
        CacheStats.from_dict({"lookups": 1, "misses": 2, "hits": 3})


@pytest.mark.parametrize("value", [-1, 1.0, True, None])
def test_fields_must_be_non_negative_integers(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^cached_pages must be a non-negative integer, got "):
        CacheStats(cached_pages=value)  # type: ignore[arg-type]
