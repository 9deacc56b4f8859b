"""How requests get KV pages: the interface both layouts offer the scheduler, and the choice.

* `paged` (`KVCacheManager`): pages from the shared pool on demand, as a sequence grows, with
  the radix prefix index reusing pages of shared prompt prefixes.
* `contiguous` (`SeatTable`): the pool cut into seats of `max_model_len` slots, a run of
  consecutive pages each; a request takes one free seat for its whole life, never grows,
  never shares, and hits no prefix cache.

A request's pages are always a page table (`pages(request_id)`), so the engine's attention
reads both layouts through the same code; in the contiguous layout the table is one run of
consecutive pages, which the page gather reads as a slice of the pool instead of a copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.manager import KVCacheManager
from astrai_batch.cache.seats import SeatTable
from astrai_batch.cache.stats import CacheStats

PAGED = "paged"
CONTIGUOUS = "contiguous"
KV_LAYOUTS = (PAGED, CONTIGUOUS)


class KVLayout(Protocol):
    """What the scheduler calls. Capacity problems are return values, misuse raises."""

    page_size: int
    num_pages: int

    @property
    def caches_prefixes(self) -> bool:
        """Whether `open` can hit pages other requests computed."""
        ...

    def can_open(self) -> bool:
        """Whether `open` would find room for one more request now."""
        ...

    def open(
        self,
        request_id: Hashable,
        tokens: Sequence[int],
        max_cached_tokens: int,
        *,
        count_lookup: bool = True,
        namespace: int = 0,
    ) -> int:
        """Register a request; returns how many leading tokens it found cached (only pages
        cached in the same `namespace`, a LoRA adapter's, can hit)."""
        ...

    def cached_prefix_length(
        self, tokens: Sequence[int], max_cached_tokens: int, namespace: int = 0
    ) -> int: ...

    def reserve(self, request_id: Hashable, num_tokens: int) -> bool:
        """Cover positions `[0, num_tokens)` with pages; False (nothing taken) when out of room."""
        ...

    def publish(self, request_id: Hashable, tokens: Sequence[int]) -> None: ...

    def reserve_scratch_page(self) -> int:
        """A page no request will ever hold (padding rows of bucketed decode steps write
        there); the same page on every call."""
        ...

    def close(self, request_id: Hashable, tokens: Sequence[int] | None = None) -> None: ...

    def pages(self, request_id: Hashable) -> list[int]: ...

    def pages_and_version(self, request_id: Hashable) -> tuple[Sequence[int], int]:
        """`pages` (immutable: a tuple or a range), and a stamp that changes whenever they do
        and never repeats (the runner keeps a copy of the table and rewrites it only when the
        stamp differs)."""
        ...

    def stats(self) -> CacheStats: ...

    def check_invariants(self) -> None: ...


def make_layout(
    name: str,
    *,
    num_pages: int,
    page_size: int,
    max_model_len: int,
    max_num_seqs: int,
    enable_prefix_cache: bool,
) -> KVLayout:
    """The layout `name` over a pool of `num_pages` pages."""
    if name == PAGED:
        return KVCacheManager(num_pages, page_size, enable_prefix_cache=enable_prefix_cache)
    if name == CONTIGUOUS:
        return SeatTable(num_pages, page_size, seat_tokens=max_model_len, max_seats=max_num_seqs)
    raise CacheUsageError(f"unknown KV layout {name!r}; known: {', '.join(KV_LAYOUTS)}")
