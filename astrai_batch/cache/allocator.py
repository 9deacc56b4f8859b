"""Reference-counted allocation of KV-cache pages.

A page is free exactly when its reference count is 0. Requests and the prefix index each hold
one reference per page they use, so a page shared by two requests and the index has count 3
and returns to the free list only when the last holder lets go. Only this class changes counts.
"""

from __future__ import annotations

from collections.abc import Iterable

from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.checks import require_positive_int


class PageAllocator:
    """O(1) allocate/free over `num_pages` page ids, with all-or-nothing multi-page calls.

    The free list is a plain Python list used as a stack and the counts a plain list indexed by
    page id: both keep the single-page allocate/free pair to a few list operations.
    """

    __slots__ = ("_free", "_refcounts", "num_pages")

    def __init__(self, num_pages: int) -> None:
        require_positive_int("num_pages", num_pages)
        self.num_pages = num_pages
        # Reversed so that pages come out in ascending order, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._refcounts: list[int] = [0] * num_pages

    def num_free(self) -> int:
        return len(self._free)

    def refcount(self, page: int) -> int:
        self._check_page(page)
        return self._refcounts[page]

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` free pages, each with count 1; `None` (and nothing taken) if fewer are free."""
        free = self._free
        if n == 1 and free:
            page = free.pop()
            self._refcounts[page] = 1
            return [page]
        if n < 0:
            raise CacheUsageError(f"cannot allocate a negative number of pages ({n})")
        if n > len(free):
            return None
        if n == 0:
            return []
        pages = free[-n:]
        del free[-n:]
        pages.reverse()
        refcounts = self._refcounts
        for page in pages:
            refcounts[page] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Add one reference to each page (twice if listed twice); every page must be in use."""
        refcounts = self._refcounts
        done: list[int] = []
        for page in pages:
            if not 0 <= page < self.num_pages or refcounts[page] <= 0:
                for taken in done:
                    refcounts[taken] -= 1
                if not 0 <= page < self.num_pages:
                    raise CacheUsageError(self._out_of_range(page))
                raise CacheUsageError(f"incref of free page {page}")
            refcounts[page] += 1
            done.append(page)

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference from each page; returns the pages that became free, in order.

        All-or-nothing: if any page is out of range or already free, every count (and the free
        list) is restored before the error is raised.
        """
        refcounts = self._refcounts
        free = self._free
        freed: list[int] = []
        done: list[int] = []
        for page in pages:
            if not 0 <= page < self.num_pages or refcounts[page] <= 0:
                self._undo_decref(done, len(freed))
                if not 0 <= page < self.num_pages:
                    raise CacheUsageError(self._out_of_range(page))
                raise CacheUsageError(f"decref of free page {page} (count would go below 0)")
            count = refcounts[page] - 1
            refcounts[page] = count
            done.append(page)
            if count == 0:
                free.append(page)
                freed.append(page)
        return freed

    def check_invariants(self) -> None:
        """Free pages have count 0 and are listed once; every other page has a positive count."""
        seen = [False] * self.num_pages
        for page in self._free:
            if not 0 <= page < self.num_pages:
                raise CacheUsageError(f"free list holds {self._out_of_range(page)}")
            if seen[page]:
                raise CacheUsageError(f"page {page} is on the free list twice")
            seen[page] = True
            if self._refcounts[page] != 0:
                raise CacheUsageError(
                    f"free page {page} has reference count {self._refcounts[page]}"
                )
        for page, count in enumerate(self._refcounts):
            if count < 0:
                raise CacheUsageError(f"page {page} has negative reference count {count}")
            if count == 0 and not seen[page]:
                raise CacheUsageError(f"page {page} has count 0 but is not on the free list")

    def _undo_decref(self, done: list[int], num_freed: int) -> None:
        if num_freed:
            del self._free[-num_freed:]
        for page in done:
            self._refcounts[page] += 1

    def _check_page(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise CacheUsageError(self._out_of_range(page))

    def _out_of_range(self, page: int) -> str:
        return f"page {page} is out of range for a pool of {self.num_pages} pages"

    def __repr__(self) -> str:
        return f"PageAllocator(num_pages={self.num_pages}, free={len(self._free)})"
