"""The contiguous KV layout: the pool cut into fixed seats, one per running request.

A seat is `seat_pages` consecutive pages, enough for `seat_tokens` tokens (the longest
sequence the engine allows), so a request that holds a seat never needs another page and
never waits on the allocator: admission is the only place capacity matters. Seats are the
only owner here: `SeatTable` maps requests to seats, nothing else hands out pages of the pool.
There is no prefix reuse, so `publish` is a no-op and every prompt token is a miss.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from astrai_batch.cache.errors import CacheUsageError, lookup_open
from astrai_batch.cache.stats import CacheStats
from astrai_batch.checks import require_positive_int
from astrai_batch.errors import ConfigError


class SeatTable:
    """`num_seats` seats of `seat_pages` consecutive pages; seat `s` holds pages
    `s * seat_pages .. (s + 1) * seat_pages - 1`. Pages past the last whole seat stay unused.
    """

    def __init__(self, num_pages: int, page_size: int, *, seat_tokens: int, max_seats: int) -> None:
        for name, value in (
            ("num_pages", num_pages),
            ("page_size", page_size),
            ("seat_tokens", seat_tokens),
            ("max_seats", max_seats),
        ):
            require_positive_int(name, value)
        self.num_pages = num_pages
        self.page_size = page_size
        self.seat_pages = -(-seat_tokens // page_size)
        self.num_seats = min(max_seats, num_pages // self.seat_pages)
        if self.num_seats < 1:
            raise ConfigError(
                f"the contiguous KV layout needs {self.seat_pages} pages for one seat of "
                f"{seat_tokens} tokens but the cache holds only {num_pages}; raise "
                "--kv-cache-memory or lower the model context"
            )
        # Reversed so seats come out in ascending order, which keeps tests readable.
        self._free: list[int] = list(range(self.num_seats - 1, -1, -1))
        self._seat_of: dict[Hashable, int] = {}
        self._version_of: dict[Hashable, int] = {}  # see `pages_and_version`
        self._stamp = 0
        self._lookups = 0
        self._missed_tokens = 0
        self._peak_seats = 0
        self._scratch_page: int | None = None  # see reserve_scratch_page

    @property
    def seat_tokens(self) -> int:
        return self.seat_pages * self.page_size

    @property
    def caches_prefixes(self) -> bool:
        return False

    def can_open(self) -> bool:
        return bool(self._free)

    def open(
        self,
        request_id: Hashable,
        tokens: Sequence[int],
        max_cached_tokens: int,
        *,
        count_lookup: bool = True,
        namespace: int = 0,
    ) -> int:
        """Give the request a free seat; nothing is ever cached, so the hit is 0.

        `count_lookup=False` (a preempted request coming back) leaves the counters alone.
        """
        if request_id in self._seat_of:
            raise CacheUsageError(f"request {request_id!r} is already open")
        if max_cached_tokens < 0:
            raise CacheUsageError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        if not self._free:
            raise CacheUsageError(f"no free seat for request {request_id!r}; check can_open")
        self._seat_of[request_id] = self._free.pop()
        self._stamp += 1
        self._version_of[request_id] = self._stamp
        if count_lookup:
            self._lookups += 1
            self._missed_tokens += len(tokens)
        self._peak_seats = max(self._peak_seats, len(self._seat_of))
        return 0

    def cached_prefix_length(
        self, tokens: Sequence[int], max_cached_tokens: int, namespace: int = 0
    ) -> int:
        if max_cached_tokens < 0:
            raise CacheUsageError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        return 0

    def reserve(self, request_id: Hashable, num_tokens: int) -> bool:
        """Always room within the seat; past it is a caller bug (the engine caps lengths)."""
        self._seat(request_id)
        if num_tokens < 0:
            raise CacheUsageError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens > self.seat_tokens:
            raise CacheUsageError(
                f"request {request_id!r} needs {num_tokens} tokens, more than a seat's "
                f"{self.seat_tokens}"
            )
        return True

    def reserve_scratch_page(self) -> int:
        """A page outside every seat, where the padding rows of a bucketed decode step write
        their keys and values: the first page past the last seat, or, when the seats fill the
        pool, the last seat gives up its pages (only before any request opened, and never the
        only seat). Later calls return the same page."""
        if self._scratch_page is None:
            if self.num_seats * self.seat_pages >= self.num_pages:
                if self._seat_of:
                    raise CacheUsageError("the scratch page is reserved before any request opens")
                if self.num_seats == 1:
                    raise ConfigError(
                        "the contiguous KV layout has room for one seat and no page besides "
                        "it for CUDA graphs' padding; raise --kv-cache-memory or use "
                        "--no-cuda-graphs"
                    )
                self.num_seats -= 1
                self._free = list(range(self.num_seats - 1, -1, -1))
            self._scratch_page = self.num_seats * self.seat_pages
        return self._scratch_page

    def publish(self, request_id: Hashable, tokens: Sequence[int]) -> None:
        self._seat(request_id)

    def close(self, request_id: Hashable, tokens: Sequence[int] | None = None) -> None:
        """Free the request's seat; `tokens` is accepted for the paged layout's sake."""
        self._free.append(self._seat(request_id))
        del self._seat_of[request_id]
        del self._version_of[request_id]

    def pages(self, request_id: Hashable) -> list[int]:
        first = self._seat(request_id) * self.seat_pages
        return list(range(first, first + self.seat_pages))

    def pages_and_version(self, request_id: Hashable) -> tuple[range, int]:
        """`pages` (as a range: no list of a whole seat's pages every step) and a stamp that
        changes when they do: a seat's pages are fixed while the request holds it, so the
        stamp changes only at `open` (and never repeats)."""
        first = self._seat(request_id) * self.seat_pages
        return range(first, first + self.seat_pages), self._version_of[request_id]

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._seat_of

    def num_open_requests(self) -> int:
        return len(self._seat_of)

    def stats(self) -> CacheStats:
        return CacheStats(
            lookups=self._lookups,
            missed_tokens=self._missed_tokens,
            pages_in_use=len(self._seat_of) * self.seat_pages,
            peak_pages_in_use=self._peak_seats * self.seat_pages,
        )

    def check_invariants(self) -> None:
        """Every seat is exactly one of free or held by one open request; the scratch page
        lies past every seat."""
        held = list(self._seat_of.values())
        seats = held + self._free
        if sorted(seats) != list(range(self.num_seats)):
            raise CacheUsageError(
                f"seats free {sorted(self._free)} and held {sorted(held)} are not each of "
                f"the {self.num_seats} seats exactly once"
            )
        if self.num_seats * self.seat_pages > self.num_pages:
            raise CacheUsageError(
                f"{self.num_seats} seats of {self.seat_pages} pages exceed the "
                f"{self.num_pages} pages of the pool"
            )
        scratch = self._scratch_page
        if scratch is not None and not self.num_seats * self.seat_pages <= scratch < self.num_pages:
            raise CacheUsageError(f"the scratch page {scratch} is not past every seat")

    def _seat(self, request_id: Hashable) -> int:
        return lookup_open(self._seat_of, request_id)

    def __repr__(self) -> str:
        return (
            f"SeatTable(num_seats={self.num_seats}, seat_pages={self.seat_pages}, "
            f"free={len(self._free)})"
        )
