from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from astrai_batch.cache import CacheUsageError, PageAllocator, PrefixIndex
from astrai_batch.errors import ConfigError


def make_index(page_size: int = 2, num_pages: int = 16) -> tuple[PageAllocator, PrefixIndex]:
    allocator = PageAllocator(num_pages)
    return allocator, PrefixIndex(page_size, allocator)


def cache(index: PrefixIndex, tokens: Sequence[int]) -> list[int]:
    """What a finished request leaves behind: its full pages, held by the index alone."""
    own = index.allocator.allocate(len(tokens) // index.page_size)
    assert own is not None
    match = index.extend(index.match(tokens, 0), tokens, own)
    index.unpin(match)
    index.allocator.decref(own)
    return match.pages


def hit(index: PrefixIndex, tokens: Sequence[int], max_tokens: int | None = None) -> int:
    match = index.match(tokens, max_tokens)
    index.unpin(match)
    return match.num_tokens


def refcounts(allocator: PageAllocator) -> list[int]:
    return [allocator.refcount(page) for page in range(allocator.num_pages)]


def test_only_whole_pages_of_identical_tokens_hit() -> None:
    allocator, index = make_index()
    assert cache(index, [1, 2, 3, 4, 5]) == [0, 1]
    assert index.num_cached_pages() == 2
    match = index.match([1, 2, 3, 4, 5, 6])
    assert (match.num_tokens, match.pages) == (4, [0, 1])
    index.unpin(match)
    expected_hits = {
        (1, 2, 3, 4): 4,
        (1, 2, 3): 2,  # the partial second page does not hit
        (1, 2, 3, 9): 2,
        (1, 2): 2,
        (1,): 0,
        (2, 1, 3, 4): 0,
        (9, 9, 3, 4): 0,  # a later page alone never hits: its K/V depends on the first
        (): 0,
    }
    assert {tokens: hit(index, tokens) for tokens in expected_hits} == expected_hits
    assert [hit(index, [1, 2, 3, 4, 5, 6], limit) for limit in (0, 1, 3, 4, 100)] == [0, 0, 2, 4, 4]
    assert refcounts(allocator)[:3] == [1, 1, 0]
    index.check_invariants()


def test_cached_prefix_length_neither_pins_nor_refreshes() -> None:
    _, index = make_index()
    assert cache(index, [1, 1, 2, 2]) == [0, 1]
    assert cache(index, [3, 3]) == [2]
    assert index.cached_prefix_length([1, 1, 2, 2, 5]) == 4
    assert index.cached_prefix_length([1, 1, 2, 2, 5], max_tokens=3) == 2
    assert index.cached_prefix_length([1, 1, 5, 5]) == 2
    assert index.pin_counts() == {0: 0, 1: 0, 2: 0}
    # Looking did not make [1, 1, 2, 2] recently used: its leaf is still evicted first.
    assert index.evict(1) == [1]
    index.check_invariants()


def test_tokens_may_be_tuples_or_tensors() -> None:
    _, index = make_index()
    cache(index, (1, 2, 3, 4))
    assert hit(index, torch.tensor([1, 2, 3, 4, 5])) == 4
    assert hit(index, (1, 2, 3)) == 2


def test_a_page_cached_twice_is_stored_once_and_the_canonical_page_returned() -> None:
    allocator, index = make_index()
    assert cache(index, [1, 2, 3, 4]) == [0, 1]
    own = allocator.allocate(3)
    assert own == [2, 3, 4]
    match = index.extend(index.match([], 0), [1, 2, 3, 4, 5, 6], own)
    assert match.pages == [0, 1, 4]
    index.unpin(match)
    assert index.num_cached_pages() == 3
    # The index took a reference on the one page it did not have, none on the duplicates.
    assert refcounts(allocator)[:5] == [1, 1, 1, 1, 2]
    assert allocator.decref(own) == [2, 3]
    index.check_invariants()


def test_pages_of_generated_tokens_hit_for_a_continuing_conversation() -> None:
    _, index = make_index(page_size=3)
    prompt, generated = [5, 6, 7, 8], [9, 10, 11, 12, 13]
    cache(index, prompt + generated)
    assert index.num_cached_pages() == 3
    assert hit(index, [*prompt, *generated, 14, 15, 16]) == 9


def test_eviction_takes_least_recently_used_leaves_and_parents_only_after_their_children() -> None:
    allocator, index = make_index()
    assert cache(index, [1, 1, 2, 2]) == [0, 1]  # x0 -> x1
    assert cache(index, [3, 3]) == [2]  # y0
    assert cache(index, [1, 1, 4, 4]) == [0, 4]  # z1 below x0; uses x0 again
    assert hit(index, [3, 3]) == 2  # y0 becomes the most recently used
    assert index.num_evictable_pages() == 4
    # x1 is oldest. x0 is as old as z1 and older by insertion, but it is not a leaf until
    # z1 goes; then it is older than y0.
    assert [index.evict(1) for _ in range(5)] == [[1], [4], [0], [2], []]
    assert index.num_cached_pages() == 0
    assert refcounts(allocator)[:5] == [0, 0, 0, 0, 0]
    index.check_invariants()


def test_one_eviction_call_continues_with_parents_that_became_leaves() -> None:
    _, index = make_index()
    cache(index, [1, 1, 2, 2])
    cache(index, [3, 3])
    cache(index, [1, 1, 4, 4])
    hit(index, [3, 3])
    assert index.evict(3) == [1, 4, 0]
    assert index.num_cached_pages() == 1
    assert index.num_evictable_pages() == 1
    index.check_invariants()


def test_recent_use_protects_a_page_from_eviction() -> None:
    _, index = make_index()
    assert cache(index, [1, 1]) == [0]
    assert cache(index, [2, 2]) == [1]
    assert hit(index, [1, 1, 5]) == 2
    assert index.evict(1) == [1]


def test_pinned_pages_are_never_evicted() -> None:
    allocator, index = make_index()
    cache(index, [1, 1, 2, 2])
    cache(index, [3, 3])
    cache(index, [1, 1, 4, 4])
    match = index.match([1, 1, 4, 4, 9])
    assert match.pages == [0, 4]
    assert index.num_evictable_pages() == 2
    assert index.pin_counts() == {0: 1, 1: 0, 2: 0, 4: 1}
    index.check_invariants()
    assert index.evict(10) == [1, 2]
    assert index.evict(1) == []
    assert index.num_cached_pages() == 2
    assert index.num_evictable_pages() == 0
    index.check_invariants()
    index.unpin(match)
    assert index.num_evictable_pages() == 2
    assert index.evict(10) == [4, 0]
    assert refcounts(allocator) == [0] * 16
    index.check_invariants()


def test_a_pinned_parent_left_as_a_leaf_waits_for_its_unpin() -> None:
    _, index = make_index()
    assert cache(index, [1, 1, 2, 2]) == [0, 1]
    assert cache(index, [1, 1, 4, 4]) == [0, 3]
    match = index.match([1, 1])
    assert index.evict(10) == [1, 3]
    assert index.num_cached_pages() == 1
    index.check_invariants()
    index.unpin(match)
    assert index.evict(10) == [0]
    index.check_invariants()


def test_matches_are_released_once_and_only_by_their_index() -> None:
    _, index = make_index()
    _, other = make_index()
    cache(index, [1, 1])
    match = index.match([1, 1])
    with pytest.raises(CacheUsageError, match=r"^this match belongs to a different PrefixIndex$"):
        other.unpin(match)
    index.unpin(match)
    assert not match.active
    with pytest.raises(CacheUsageError, match=r"^this match was already unpinned or extended$"):
        index.unpin(match)
    assert index.pin_counts() == {0: 0}


def test_extend_inserts_below_a_match_and_keeps_the_whole_path_pinned() -> None:
    allocator, index = make_index()
    cache(index, [1, 1, 2, 2])
    first = index.match([1, 1, 2, 2, 3, 3])
    own = allocator.allocate(1)
    assert own == [2]
    longer = index.extend(first, [1, 1, 2, 2, 3, 3, 4], [0, 1, 2])
    assert not first.active
    assert (longer.num_tokens, longer.pages) == (6, [0, 1, 2])
    assert index.pin_counts() == {0: 1, 1: 1, 2: 1}
    assert refcounts(allocator)[:3] == [1, 1, 2]
    index.check_invariants()
    # A second request computed the same third page itself: it learns the canonical one.
    second = index.match([1, 1, 2, 2, 3, 3], max_tokens=5)
    assert second.pages == [0, 1]
    duplicate = allocator.allocate(1)
    assert duplicate == [3]
    second = index.extend(second, [1, 1, 2, 2, 3, 3], [0, 1, 3])
    assert second.pages == [0, 1, 2]
    assert refcounts(allocator)[:4] == [1, 1, 2, 1]
    assert index.pin_counts() == {0: 2, 1: 2, 2: 2}
    index.unpin(longer)
    index.unpin(second)
    assert index.pin_counts() == {0: 0, 1: 0, 2: 0}
    index.check_invariants()


def test_extend_rejects_tokens_that_do_not_continue_the_match() -> None:
    allocator, index = make_index()
    cache(index, [1, 1, 2, 2])
    match = index.match([1, 1, 2, 2])
    own = allocator.allocate(1)
    with pytest.raises(
        CacheUsageError, match=r"^extend got tokens that do not continue the matched prefix$"
    ):
        index.extend(match, [1, 1, 9, 9, 3, 3], [0, 1, *own])
    with pytest.raises(CacheUsageError, match=r"^extend got 2 tokens, fewer than the 4 matched$"):
        index.extend(match, [1, 1], [0])
    assert match.active
    assert index.num_cached_pages() == 2
    index.unpin(match)
    index.check_invariants()


@pytest.mark.parametrize(
    ("tokens", "pages", "message"),
    [
        ([5, 5, 6, 6], [1], r"^2 full pages of tokens need 2 pages, got 1$"),
        ([5, 5, 6, 6], [1, 0], r"^page 0 is already cached for other tokens$"),
        ([5, 5, 6, 6], [1, 1], r"^the same page appears twice among pages \[1, 1\]$"),
        ([5, 5, 6, 6], [1, 7], r"^page 7 is not an allocated page$"),
        ([5, 5], [99], r"^page 99 is not an allocated page$"),
    ],
)
def test_bad_inserts_raise_and_change_nothing(
    tokens: list[int], pages: list[int], message: str
) -> None:
    allocator, index = make_index()
    cache(index, [1, 1])
    assert allocator.allocate(1) == [1]
    before = refcounts(allocator)
    with pytest.raises(CacheUsageError, match=message):
        index.extend(index.match(tokens, 0), tokens, pages)
    assert refcounts(allocator) == before
    assert index.num_cached_pages() == 1
    assert hit(index, [5, 5]) == 0
    index.check_invariants()


def test_eviction_candidates_do_not_pile_up_with_repeated_use() -> None:
    _, index = make_index()
    cache(index, [1, 1])
    for _ in range(500):
        hit(index, [1, 1])
    assert len(index._eviction_queue) <= 2 * index.num_cached_pages() + 65
    index.check_invariants()
    assert index.evict(5) == [0]


def test_page_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"^page_size must be >= 1, got 0$"):
        PrefixIndex(0, PageAllocator(1))


def test_negative_counts_are_rejected() -> None:
    _, index = make_index()
    with pytest.raises(CacheUsageError, match=r"^cannot evict a negative number of pages \(-1\)$"):
        index.evict(-1)
    with pytest.raises(CacheUsageError, match=r"^max_tokens must be >= 0, got -1$"):
        index.match([1, 1], -1)


def test_check_invariants_catches_a_broken_parent_link() -> None:
    _, index = make_index()
    cache(index, [1, 1, 2, 2])
    index._roots[(1, 1)].children[(2, 2)].parent = None
    with pytest.raises(
        CacheUsageError, match=r"^node of page 1 does not point back to its parent$"
    ):
        index.check_invariants()


def test_check_invariants_catches_a_cached_page_freed_behind_the_index() -> None:
    allocator, index = make_index()
    cache(index, [1, 1])
    allocator.decref([0])
    with pytest.raises(
        CacheUsageError, match=r"^node of page 0 caches a page the allocator holds as free$"
    ):
        index.check_invariants()


def test_check_invariants_catches_an_unpinned_leaf_missing_from_the_candidates() -> None:
    _, index = make_index()
    cache(index, [1, 1])
    index._eviction_queue.clear()
    with pytest.raises(CacheUsageError, match=r"^eviction candidates differ from the unpinned"):
        index.check_invariants()
