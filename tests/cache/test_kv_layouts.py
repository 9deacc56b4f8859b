"""The two KV layouts behind one interface: seats of consecutive pages, and the paged table."""

from __future__ import annotations

import pytest

from astrai_batch.cache import (
    KV_LAYOUTS,
    CacheUsageError,
    KVCacheManager,
    SeatTable,
    make_layout,
)
from astrai_batch.errors import ConfigError


def seats(num_pages=20, page_size=4, seat_tokens=22, max_seats=8) -> SeatTable:
    return SeatTable(num_pages, page_size, seat_tokens=seat_tokens, max_seats=max_seats)


def test_seats_are_runs_of_consecutive_pages_taken_in_order():
    table = seats()  # 22 tokens -> 6 pages of 4; 20 pages hold 3 seats
    assert (table.seat_pages, table.num_seats, table.seat_tokens) == (6, 3, 24)
    assert table.open("a", [1, 2, 3], max_cached_tokens=2) == 0
    assert table.open("b", [4, 5], max_cached_tokens=1) == 0
    assert table.pages("a") == [0, 1, 2, 3, 4, 5]
    assert table.pages("b") == [6, 7, 8, 9, 10, 11]
    pages, version = table.pages_and_version("b")
    assert (pages, table.pages_and_version("a")[1] != version) == (range(6, 12), True)
    assert table.reserve("a", 24) is True
    table.publish("a", [1, 2, 3, 4])
    table.check_invariants()
    table.close("a", [1, 2, 3, 4])
    assert table.open("c", [7], max_cached_tokens=0) == 0
    assert table.pages("c") == [0, 1, 2, 3, 4, 5]  # the seat "a" gave back
    table.check_invariants()


def test_a_full_table_refuses_admission_and_a_close_makes_room():
    table = seats(max_seats=2)
    table.open("a", [1], 0)
    assert table.can_open()
    table.open("b", [1], 0)
    assert not table.can_open()
    with pytest.raises(CacheUsageError, match=r"^no free seat for request 'c'; check can_open$"):
        table.open("c", [1], 0)
    table.close("b")
    assert table.can_open()
    table.check_invariants()


def test_seat_table_misuse_raises():
    table = seats()
    with pytest.raises(CacheUsageError, match=r"^request 'x' is not open$"):
        table.pages("x")
    table.open("a", [1], 0)
    with pytest.raises(CacheUsageError, match=r"^request 'a' is already open$"):
        table.open("a", [1], 0)
    with pytest.raises(
        CacheUsageError, match=r"^request 'a' needs 25 tokens, more than a seat's 24$"
    ):
        table.reserve("a", 25)


def test_a_pool_smaller_than_one_seat_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        seats(num_pages=5)
    assert str(caught.value) == (
        "the contiguous KV layout needs 6 pages for one seat of 22 tokens but the cache holds "
        "only 5; raise --kv-cache-memory or lower the model context"
    )


def test_seat_stats_count_every_prompt_token_as_a_miss_and_whole_seats_in_use():
    table = seats()
    table.open("a", [1, 2, 3], 2)
    table.open("b", [4, 5], 1)
    table.close("a")
    stats = table.stats()
    assert (stats.lookups, stats.hit_tokens, stats.missed_tokens) == (2, 0, 5)
    assert (stats.pages_in_use, stats.peak_pages_in_use, stats.cached_pages) == (6, 12, 0)
    assert table.cached_prefix_length([1, 2, 3, 4, 5, 6, 7, 8], 8) == 0


def test_seat_invariants_catch_a_seat_held_twice():
    table = seats()
    table.open("a", [1], 0)
    table._seat_of["b"] = table._seat_of["a"]  # what a bookkeeping bug would look like
    with pytest.raises(CacheUsageError, match="are not each of the 3 seats exactly once"):
        table.check_invariants()


def test_make_layout_builds_each_layout():
    assert KV_LAYOUTS == ("paged", "contiguous")
    common = dict(num_pages=20, page_size=4, max_model_len=22, max_num_seqs=8)
    paged = make_layout("paged", enable_prefix_cache=True, **common)
    assert isinstance(paged, KVCacheManager)
    assert paged.caches_prefixes and paged.can_open()
    contiguous = make_layout("contiguous", enable_prefix_cache=True, **common)
    assert isinstance(contiguous, SeatTable)
    assert not contiguous.caches_prefixes
    with pytest.raises(CacheUsageError, match=r"^unknown KV layout 'ring'; known: paged, "):
        make_layout("ring", enable_prefix_cache=True, **common)
