from __future__ import annotations

import pytest

from astrai_batch.cache import CacheStats, CacheUsageError, KVCacheManager
from astrai_batch.errors import ConfigError


def snapshot(manager: KVCacheManager) -> tuple[object, ...]:
    """Everything a refused call must leave alone."""
    allocator = manager.allocator
    return (
        manager.stats(),
        [allocator.refcount(page) for page in range(manager.num_pages)],
        manager.num_free_pages(),
        manager.num_evictable_pages(),
        None if manager.index is None else manager.index.pin_counts(),
    )


def test_a_scripted_run_gives_exact_pages_and_statistics() -> None:
    manager = KVCacheManager(num_pages=8, page_size=4)
    prompt = list(range(10, 20))
    assert manager.open("a", prompt, max_cached_tokens=9) == 0
    assert manager.reserve("a", 10)
    assert manager.pages("a") == [0, 1, 2]
    manager.publish("a", prompt)
    tokens_a = [*prompt, 20, 21]  # two generated tokens fill the third page
    assert manager.reserve("a", 12)
    manager.publish("a", tokens_a)
    assert manager.stats().inserted_pages == 3
    manager.check_invariants()

    # Limited to 10 tokens, b can hit two whole pages of a's prompt.
    assert manager.open("b", [*prompt, 30], max_cached_tokens=10) == 8
    assert manager.pages("b") == [0, 1]
    assert [manager.allocator.refcount(page) for page in (0, 1, 2)] == [3, 3, 2]
    assert manager.reserve("b", 11)
    assert manager.pages("b") == [0, 1, 3]
    manager.close("a")
    assert manager.num_evictable_pages() == 1  # a's third page, now held only by the index
    manager.check_invariants()

    assert manager.open("c", [50] * 8 + [51], max_cached_tokens=8) == 0
    assert manager.reserve("c", 9)
    assert manager.pages("c") == [4, 5, 6]
    assert manager.available_pages() == 2
    assert manager.open("d", [60] * 8, max_cached_tokens=7) == 0
    assert manager.reserve("d", 8)  # one free page plus one evicted
    assert manager.pages("d") == [2, 7]
    assert manager.open("e", [70] * 4, max_cached_tokens=3) == 0
    assert not manager.reserve("e", 4)  # b pins the only cached pages
    manager.check_invariants()

    # e was never admitted (its reserve was refused), so its lookup is not counted.
    assert manager.stats() == CacheStats(
        lookups=4,
        hit_tokens=8,
        missed_tokens=10 + 3 + 9 + 8,
        inserted_pages=3,
        evicted_pages=1,
        pages_in_use=8,
        cached_pages=2,
        peak_pages_in_use=8,
    )
    assert manager.stats().hit_rate == 8 / 38
    midway = manager.stats()
    manager.close("b", [*prompt, 30])
    for request_id in ("c", "d", "e"):
        manager.close(request_id)
    manager.check_invariants()
    assert manager.num_open_requests() == 0
    assert manager.num_free_pages() == 6
    assert manager.stats() == CacheStats(4, 8, 30, 3, 1, 0, 2, 8)
    assert manager.stats() - midway == CacheStats(0, 0, 0, 0, 0, 0, 2, 8)


def test_requests_that_computed_the_same_pages_end_up_sharing_them() -> None:
    manager = KVCacheManager(num_pages=8, page_size=2)
    tokens = [1, 2, 3, 4, 5]
    assert manager.open("a", tokens, max_cached_tokens=4) == 0
    assert manager.open("b", tokens, max_cached_tokens=4) == 0
    assert manager.reserve("a", 5)
    assert manager.reserve("b", 5)
    assert (manager.pages("a"), manager.pages("b")) == ([0, 1, 2], [3, 4, 5])
    manager.publish("a", tokens)
    manager.publish("b", tokens)
    # b switched to a's copies of the two full pages and its own copies went back.
    assert (manager.pages("a"), manager.pages("b")) == ([0, 1, 2], [0, 1, 5])
    assert [manager.allocator.refcount(page) for page in range(6)] == [3, 3, 1, 0, 0, 1]
    assert manager.num_free_pages() == 4
    assert manager.stats().inserted_pages == 2
    manager.check_invariants()
    manager.close("a")
    manager.close("b")
    assert manager.stats().cached_pages == 2
    assert manager.num_evictable_pages() == 2
    manager.check_invariants()


def test_a_hit_and_a_later_publish_share_one_physical_page() -> None:
    manager = KVCacheManager(num_pages=8, page_size=2)
    manager.open("a", [1, 2, 3, 4], max_cached_tokens=3)
    manager.reserve("a", 4)
    manager.publish("a", [1, 2, 3, 4])
    # b may only reuse the first page (it must compute its last prompt token), computes the
    # second itself, and on publishing learns that a's copy is canonical.
    assert manager.open("b", [1, 2, 3, 4], max_cached_tokens=3) == 2
    assert manager.reserve("b", 4)
    assert manager.pages("b") == [0, 2]
    manager.publish("b", [1, 2, 3, 4])
    assert manager.pages("b") == [0, 1]
    assert manager.allocator.refcount(1) == 3  # the index, a and b
    assert manager.allocator.refcount(2) == 0
    manager.check_invariants()


def test_refused_reservations_change_nothing() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2)
    manager.open("a", [1, 2, 3, 4], max_cached_tokens=3)
    assert manager.reserve("a", 4)
    manager.close("a", [1, 2, 3, 4])
    manager.open("b", [5] * 6, max_cached_tokens=5)
    assert (manager.num_free_pages(), manager.num_evictable_pages()) == (2, 2)
    before = snapshot(manager)
    assert not manager.reserve("b", 10)  # 5 pages: more than free + evictable
    assert not manager.reserve("b", 9)
    assert snapshot(manager) == before
    assert manager.pages("b") == []
    assert manager.allocator.allocate(5) is None
    assert snapshot(manager) == before
    manager.check_invariants()
    assert manager.reserve("b", 8)
    assert manager.stats().evicted_pages == 2
    manager.check_invariants()


def test_cached_prefix_length_predicts_the_hit_without_side_effects() -> None:
    manager = KVCacheManager(num_pages=8, page_size=2)
    manager.open("a", [1, 2, 3, 4, 5], max_cached_tokens=4)
    manager.reserve("a", 5)
    manager.close("a", [1, 2, 3, 4, 5])
    before = snapshot(manager)
    assert manager.cached_prefix_length([1, 2, 3, 4, 6], max_cached_tokens=4) == 4
    assert manager.cached_prefix_length([1, 2, 3, 4, 6], max_cached_tokens=3) == 2
    assert manager.cached_prefix_length([2, 2], max_cached_tokens=2) == 0
    assert snapshot(manager) == before
    assert manager.open("b", [1, 2, 3, 4, 6], max_cached_tokens=4) == 4
    disabled = KVCacheManager(num_pages=2, page_size=2, enable_prefix_cache=False)
    assert disabled.cached_prefix_length([1, 2], max_cached_tokens=2) == 0


def test_a_disabled_prefix_cache_never_hits_or_caches() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2, enable_prefix_cache=False)
    assert manager.index is None
    for request_id in ("a", "b"):
        assert manager.open(request_id, [1, 2, 3, 4], max_cached_tokens=4) == 0
        assert manager.reserve(request_id, 4)
        manager.publish(request_id, [1, 2, 3, 4])
        manager.check_invariants()
    assert not manager.reserve("b", 6)
    assert manager.evict(4) == []
    manager.close("a")
    manager.close("b", [1, 2, 3, 4])
    assert manager.stats() == CacheStats(2, 0, 8, 0, 0, 0, 0, 4)
    assert manager.num_free_pages() == 4
    manager.check_invariants()


def test_close_with_tokens_publishes_them_first() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2)
    manager.open("a", [1, 2, 3], max_cached_tokens=2)
    manager.reserve("a", 5)
    manager.close("a", [1, 2, 3, 4, 5])
    assert manager.stats().cached_pages == 2
    assert manager.num_evictable_pages() == 2
    assert manager.num_free_pages() == 2
    assert manager.evict(1) == [1]
    assert manager.stats().evicted_pages == 1
    manager.check_invariants()


def test_misuse_is_reported_with_the_request_named() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2)
    manager.open("a", [1, 2, 3, 4], max_cached_tokens=0)
    with pytest.raises(CacheUsageError, match=r"^request 'a' is already open$"):
        manager.open("a", [1, 2], max_cached_tokens=0)
    with pytest.raises(CacheUsageError, match=r"^request 'zz' is not open$"):
        manager.reserve("zz", 1)
    with pytest.raises(CacheUsageError, match=r"^request 'zz' is not open$"):
        manager.close("zz")
    assert manager.reserve("a", 2)
    with pytest.raises(CacheUsageError, match=r"^request 'a' publishes 2 full pages but holds 1$"):
        manager.publish("a", [1, 2, 3, 4])
    with pytest.raises(CacheUsageError, match=r"^max_cached_tokens must be >= 0, got -1$"):
        manager.open("b", [1], max_cached_tokens=-1)
    with pytest.raises(CacheUsageError, match=r"^num_tokens must be >= 0, got -2$"):
        manager.reserve("a", -2)
    assert "b" not in manager
    assert "a" in manager
    manager.check_invariants()


def test_page_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"^page_size must be >= 1, got 0$"):
        KVCacheManager(num_pages=4, page_size=0)


def test_check_invariants_catches_a_reference_taken_behind_its_back() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2)
    manager.open("a", [1, 2], max_cached_tokens=0)
    manager.reserve("a", 2)
    manager.allocator.incref([0])
    with pytest.raises(
        CacheUsageError, match=r"^page 0 has reference count 2, expected 1 \(1 open requests\)$"
    ):
        manager.check_invariants()


def test_check_invariants_catches_a_pin_no_request_accounts_for() -> None:
    manager = KVCacheManager(num_pages=4, page_size=2)
    manager.open("a", [1, 2], max_cached_tokens=0)
    manager.reserve("a", 2)
    manager.publish("a", [1, 2])
    assert manager.index is not None
    manager.index.match([1, 2])
    with pytest.raises(
        CacheUsageError, match=r"^cached page 0 is pinned 2 times but held by 1 open requests$"
    ):
        manager.check_invariants()


def test_a_lookup_counts_once_at_admission_and_refused_admissions_count_nothing() -> None:
    manager = KVCacheManager(num_pages=8, page_size=4)
    manager.open("warm", list(range(8)), max_cached_tokens=8)
    assert manager.reserve("warm", 8)
    manager.close("warm", list(range(8)))  # 2 cached pages
    manager.open("big", [50] * 20, max_cached_tokens=19)
    assert manager.reserve("big", 20)  # 5 pages: 1 free page and 2 cached pages remain
    before = snapshot(manager)
    assert before[0] == CacheStats(2, 0, 28, 2, 0, 5, 2, 5)
    prompt = [*range(8), *[60] * 16]  # 24 tokens; the first 8 are cached
    for _ in range(2):  # opened, no room (6 pages wanted, 1 free + 1 evictable), closed
        assert manager.open("late", prompt, max_cached_tokens=23) == 8
        assert not manager.reserve("late", 24)
        manager.close("late")
        assert snapshot(manager) == before  # every counter, the peak included
    manager.close("big")
    assert manager.open("late", prompt, max_cached_tokens=23) == 8
    assert manager.stats() == CacheStats(2, 0, 28, 2, 0, 2, 2, 5)  # pinned, not yet counted
    assert manager.reserve("late", 24)
    assert manager.reserve("late", 28)  # a later reserve is not a second lookup
    stats = manager.stats()
    assert (stats.lookups, stats.hit_tokens, stats.missed_tokens) == (3, 8, 28 + 16)
    assert stats.hit_rate == 8 / 52
    # A request opened without counting (a preempted sequence's return) adds nothing.
    manager.close("late")
    assert manager.open("again", prompt, max_cached_tokens=23, count_lookup=False) == 8
    assert manager.reserve("again", 24)
    assert manager.stats().lookups == 3
    manager.check_invariants()


def test_the_page_table_is_handed_out_once_per_version_as_an_immutable_copy() -> None:
    manager = KVCacheManager(num_pages=8, page_size=2)
    tokens = [1, 2, 3, 4, 5]
    manager.open("a", tokens, max_cached_tokens=4)
    manager.open("b", tokens, max_cached_tokens=4)
    manager.reserve("a", 5)
    manager.reserve("b", 5)
    table, version = manager.pages_and_version("b")
    assert (table, version) == ((3, 4, 5), manager.pages_version("b"))
    again, same = manager.pages_and_version("b")
    assert again is table and same == version  # unchanged: no copy taken
    manager.reserve("b", 6)  # covered already: nothing changes
    assert manager.pages_and_version("b") == (table, version)
    manager.publish("a", tokens)
    manager.publish("b", tokens)  # b switches to a's pages: a new version, a new copy
    switched, newer = manager.pages_and_version("b")
    assert (switched, newer != version) == ((0, 1, 5), True)
    assert table == (3, 4, 5)  # the copy handed out earlier never changes
    manager.reserve("b", 7)
    assert manager.pages_and_version("b")[0] == (0, 1, 5, 4)
    manager.check_invariants()


def test_check_invariants_catches_a_page_table_changed_without_a_new_version() -> None:
    manager = KVCacheManager(num_pages=8, page_size=2)
    manager.open("a", [1, 2, 3], max_cached_tokens=2)
    manager.reserve("a", 3)
    manager.pages_and_version("a")
    manager._requests["a"].pages[1] = 7  # a bug: the table changed, its version did not
    with pytest.raises(CacheUsageError, match="request 'a' changed its pages without a new"):
        manager.check_invariants()
