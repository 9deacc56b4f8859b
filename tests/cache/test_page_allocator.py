from __future__ import annotations

import pytest

from astrai_batch.cache import CacheUsageError, PageAllocator
from astrai_batch.errors import AstraiBatchError, ConfigError


def counts(allocator: PageAllocator) -> list[int]:
    return [allocator.refcount(page) for page in range(allocator.num_pages)]


def test_allocate_hands_out_ascending_pages_with_count_one() -> None:
    allocator = PageAllocator(5)
    assert allocator.allocate(3) == [0, 1, 2]
    assert allocator.allocate(1) == [3]
    assert counts(allocator) == [1, 1, 1, 1, 0]
    assert allocator.num_free() == 1
    allocator.check_invariants()


def test_allocate_is_all_or_nothing() -> None:
    allocator = PageAllocator(4)
    assert allocator.allocate(3) == [0, 1, 2]
    assert allocator.allocate(2) is None
    assert allocator.num_free() == 1
    assert counts(allocator) == [1, 1, 1, 0]
    assert allocator.allocate(1) == [3]
    assert allocator.allocate(1) is None
    assert allocator.allocate(0) == []
    allocator.check_invariants()


def test_negative_allocation_is_rejected() -> None:
    with pytest.raises(
        CacheUsageError, match=r"^cannot allocate a negative number of pages \(-1\)$"
    ):
        PageAllocator(2).allocate(-1)


def test_decref_returns_pages_that_became_free_and_they_are_reused_last_in_first_out() -> None:
    allocator = PageAllocator(4)
    pages = allocator.allocate(3)
    assert pages == [0, 1, 2]
    allocator.incref([1, 1])
    assert counts(allocator) == [1, 3, 1, 0]
    assert allocator.decref([0, 1, 2]) == [0, 2]
    assert counts(allocator) == [0, 2, 0, 0]
    assert allocator.num_free() == 3
    assert allocator.allocate(1) == [2]
    assert allocator.allocate(1) == [0]
    assert allocator.decref([1, 1]) == [1]
    allocator.check_invariants()


def test_decref_of_a_free_page_raises_and_changes_nothing() -> None:
    allocator = PageAllocator(4)
    allocator.allocate(2)
    with pytest.raises(
        CacheUsageError, match=r"^decref of free page 3 \(count would go below 0\)$"
    ):
        allocator.decref([0, 1, 3])
    assert counts(allocator) == [1, 1, 0, 0]
    assert allocator.num_free() == 2
    allocator.check_invariants()
    # The free list is intact too: the next two pages come out in the usual order.
    assert allocator.allocate(2) == [2, 3]


def test_decref_of_the_same_page_twice_past_zero_is_rolled_back() -> None:
    allocator = PageAllocator(3)
    allocator.allocate(2)
    with pytest.raises(CacheUsageError, match=r"^decref of free page 1 "):
        allocator.decref([1, 0, 1])
    assert counts(allocator) == [1, 1, 0]
    assert allocator.num_free() == 1
    allocator.check_invariants()


def test_incref_of_a_free_page_raises_and_changes_nothing() -> None:
    allocator = PageAllocator(3)
    allocator.allocate(1)
    with pytest.raises(CacheUsageError, match=r"^incref of free page 2$"):
        allocator.incref([0, 2])
    assert counts(allocator) == [1, 0, 0]
    allocator.check_invariants()


@pytest.mark.parametrize("page", [-1, 3])
def test_pages_out_of_range_are_rejected(page: int) -> None:
    allocator = PageAllocator(3)
    allocator.allocate(3)
    message = rf"^page {page} is out of range for a pool of 3 pages$"
    with pytest.raises(CacheUsageError, match=message):
        allocator.refcount(page)
    with pytest.raises(CacheUsageError, match=message):
        allocator.incref([page])
    with pytest.raises(CacheUsageError, match=message):
        allocator.decref([0, page])
    assert counts(allocator) == [1, 1, 1]


@pytest.mark.parametrize(
    ("num_pages", "message"),
    [
        (0, "num_pages must be >= 1, got 0"),
        (-2, "num_pages must be >= 1, got -2"),
        (1.5, "num_pages must be an integer, got number"),
        (True, "num_pages must be an integer, got boolean"),
    ],
)
def test_pool_size_must_be_a_positive_integer(num_pages: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PageAllocator(num_pages)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_check_invariants_catches_a_corrupted_count() -> None:
    allocator = PageAllocator(3)
    allocator.allocate(1)
    allocator._refcounts[2] = 1  # a count raised without taking the page off the free list
    with pytest.raises(AstraiBatchError, match=r"^free page 2 has reference count 1$"):
        allocator.check_invariants()


def test_check_invariants_catches_a_page_missing_from_the_free_list() -> None:
    allocator = PageAllocator(3)
    allocator._free.remove(1)
    with pytest.raises(CacheUsageError, match=r"^page 1 has count 0 but is not on the free list$"):
        allocator.check_invariants()


def test_check_invariants_catches_a_page_listed_free_twice() -> None:
    allocator = PageAllocator(3)
    allocator._free.append(0)
    with pytest.raises(CacheUsageError, match=r"^page 0 is on the free list twice$"):
        allocator.check_invariants()
