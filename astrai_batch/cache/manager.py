"""The request table: which pages each running request holds, and how they meet the prefix index.

Every page is exactly one of: free (count 0), in use (held by at least one open request), or
cached and evictable (held only by the prefix index, unpinned). A request pins every index node
whose page it holds, so "unpinned" and "held only by the index" are the same thing, and
eviction frees exactly the pages it promises.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from astrai_batch.cache.allocator import PageAllocator
from astrai_batch.cache.consistency import check_page_counts
from astrai_batch.cache.errors import CacheUsageError, lookup_open
from astrai_batch.cache.open_request import OpenRequest
from astrai_batch.cache.prefix_index import PrefixIndex
from astrai_batch.cache.radix_node import PrefixMatch
from astrai_batch.cache.stats import CacheStats
from astrai_batch.checks import require_positive_int


class KVCacheManager:
    """Page allocator + prefix index + request table: the cache API the scheduler calls."""

    def __init__(self, num_pages: int, page_size: int, enable_prefix_cache: bool = True) -> None:
        require_positive_int("page_size", page_size)
        self.page_size = page_size
        self.num_pages = num_pages
        self.allocator = PageAllocator(num_pages)
        self.index: PrefixIndex | None = (
            PrefixIndex(page_size, self.allocator) if enable_prefix_cache else None
        )
        self._requests: dict[Hashable, OpenRequest] = {}
        self._lookups = 0
        self._hit_tokens = 0
        self._missed_tokens = 0
        self._inserted_pages = 0
        self._evicted_pages = 0
        self._peak_pages_in_use = 0
        self._page_table_stamp = 0  # last version handed out; versions never repeat
        self._scratch_page: int | None = None  # see reserve_scratch_page

    @property
    def caches_prefixes(self) -> bool:
        return self.index is not None

    def can_open(self) -> bool:
        """Always: a paged request takes pages only in `reserve`, which may refuse."""
        return True

    def open(
        self,
        request_id: Hashable,
        tokens: Sequence[int],
        max_cached_tokens: int,
        *,
        count_lookup: bool = True,
        namespace: int = 0,
    ) -> int:
        """Register a request and give it the cached pages of its prompt; returns hit tokens.
        Only pages cached in the same `namespace` (a LoRA adapter; 0 the base) can hit.

        Only `tokens[:max_cached_tokens]` may hit (the engine keeps at least one prompt token to
        compute), and only whole pages, so the result is a multiple of `page_size`.

        The lookup is counted (`lookups`, `hit_tokens`, `missed_tokens`) when the request's
        first `reserve` succeeds, i.e. when it is admitted: a request opened, refused pages and
        closed again changes no counter. `count_lookup=False` opens without counting (a
        preempted request coming back, whose lookup was counted at its first admission).
        """
        if request_id in self._requests:
            raise CacheUsageError(f"request {request_id!r} is already open")
        if max_cached_tokens < 0:
            raise CacheUsageError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        match: PrefixMatch | None = None
        pages: list[int] = []
        if self.index is not None:
            match = self.index.match(tokens, max_cached_tokens, namespace)
            self.allocator.incref(match.pages)
            pages = list(match.pages)
        hit = 0 if match is None else match.num_tokens
        lookup = (hit, len(tokens) - hit) if count_lookup else None
        self._requests[request_id] = OpenRequest(match, pages, lookup, self._next_version())
        return hit

    def cached_prefix_length(
        self, tokens: Sequence[int], max_cached_tokens: int, namespace: int = 0
    ) -> int:
        """The hit `open` would give these tokens now; pins, counts and touches nothing."""
        if max_cached_tokens < 0:
            raise CacheUsageError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        if self.index is None:
            return 0
        return self.index.cached_prefix_length(tokens, max_cached_tokens, namespace)

    def reserve(self, request_id: Hashable, num_tokens: int) -> bool:
        """Make the request's pages cover positions `[0, num_tokens)`, evicting if needed.

        All-or-nothing: returns False, with no page taken and nothing evicted, when free plus
        evictable pages cannot cover the shortfall.
        """
        request = self._requests.get(request_id) or self._request(request_id)
        if num_tokens < 0:
            raise CacheUsageError(f"num_tokens must be >= 0, got {num_tokens}")
        missing = -(-num_tokens // self.page_size) - len(request.pages)
        if missing <= 0 and request.lookup is None:
            return True  # nothing changes: the common case, every running sequence every step
        if missing > 0:
            shortfall = missing - self.allocator.num_free()
            if shortfall > 0:
                if self.index is None or shortfall > self.index.num_evictable_pages():
                    return False
                self._evicted_pages += len(self.index.evict(shortfall))
            new_pages = self.allocator.allocate(missing)
            if new_pages is None:
                raise CacheUsageError(
                    "eviction freed fewer pages than it counted evictable: a cached page is "
                    "held outside the manager without a pin"
                )
            request.pages.extend(new_pages)
            request.version = self._next_version()
        if request.lookup is not None:
            hit, missed = request.lookup
            request.lookup = None
            self._lookups += 1
            self._hit_tokens += hit
            self._missed_tokens += missed
        self._note_usage()
        return True

    def reserve_scratch_page(self) -> int:
        """A page no request ever holds: where the padding rows of a bucketed decode step
        write their keys and values. Taken from the allocator once (reference count 1, held by
        this manager for its whole life); later calls return the same page."""
        if self._scratch_page is None:
            pages = self.allocator.allocate(1)
            if pages is None and self.evict(1):
                pages = self.allocator.allocate(1)
            if pages is None:
                raise CacheUsageError("no free page for the scratch page: every page is in use")
            self._scratch_page = pages[0]
            self._note_usage()
        return self._scratch_page

    def publish(self, request_id: Hashable, tokens: Sequence[int]) -> None:
        """Offer the full pages of `tokens` (whose K/V is written) to the prefix index.

        Pages published earlier are skipped, so calling this every step costs O(new pages).
        Where another request already cached an identical page, this request switches to that
        canonical page and its duplicate is freed: `pages(request_id)` can change.
        """
        request = self._requests.get(request_id) or self._request(request_id)
        if self.index is None or request.match is None:
            return
        num_full = len(tokens) // self.page_size
        first = request.num_published_pages()
        if num_full <= first:
            return
        own = request.pages
        if num_full > len(own):
            raise CacheUsageError(
                f"request {request_id!r} publishes {num_full} full pages but holds {len(own)}"
            )
        match = self.index.extend(request.match, tokens, own)
        request.match = match
        switch_to: list[int] = []
        switch_from: list[int] = []
        for position in range(first, num_full):
            canonical = match.pages[position]
            if canonical != own[position]:
                switch_to.append(canonical)
                switch_from.append(own[position])
                own[position] = canonical
        if switch_to:
            request.version = self._next_version()
            self.allocator.incref(switch_to)
            self.allocator.decref(switch_from)
        self._inserted_pages += num_full - first - len(switch_to)
        self._note_usage()

    def close(self, request_id: Hashable, tokens: Sequence[int] | None = None) -> None:
        """Publish `tokens` (if given), then release the request's pins and pages and forget it."""
        request = self._request(request_id)
        if tokens is not None:
            self.publish(request_id, tokens)
        del self._requests[request_id]
        if request.match is not None and self.index is not None:
            self.index.unpin(request.match)
        self.allocator.decref(request.pages)

    def evict(self, num_pages: int) -> list[int]:
        """Free up to `num_pages` cached pages no request uses (LRU leaves first)."""
        if self.index is None:
            return []
        freed = self.index.evict(num_pages)
        self._evicted_pages += len(freed)
        return freed

    def pages(self, request_id: Hashable) -> list[int]:
        """A copy of the request's page table: page of position p is `pages[p // page_size]`."""
        return list(self._request(request_id).pages)

    def pages_and_version(self, request_id: Hashable) -> tuple[tuple[int, ...], int]:
        """The page table (immutable) and `pages_version`, in one lookup: asked for every
        sequence every step, while a table changes once every `page_size` tokens, so the
        copy is taken once per version."""
        request = self._requests.get(request_id) or self._request(request_id)
        snapshot = request.snapshot
        if snapshot is None or snapshot[0] != request.version:
            snapshot = request.snapshot = (request.version, tuple(request.pages))
        return snapshot[1], request.version

    def pages_version(self, request_id: Hashable) -> int:
        """A stamp that changes whenever the request's page table changes, and that no other
        page table (of this or any request, before or after) ever had: a caller that keeps a
        copy of the table rewrites it only when the stamp differs from the copy's."""
        return self._request(request_id).version

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._requests

    def num_open_requests(self) -> int:
        return len(self._requests)

    def num_free_pages(self) -> int:
        return self.allocator.num_free()

    def num_evictable_pages(self) -> int:
        return 0 if self.index is None else self.index.num_evictable_pages()

    def available_pages(self) -> int:
        """Pages a `reserve` could obtain right now: free plus evictable."""
        return self.num_free_pages() + self.num_evictable_pages()

    def stats(self) -> CacheStats:
        return CacheStats(
            lookups=self._lookups,
            hit_tokens=self._hit_tokens,
            missed_tokens=self._missed_tokens,
            inserted_pages=self._inserted_pages,
            evicted_pages=self._evicted_pages,
            pages_in_use=self._pages_in_use(),
            cached_pages=0 if self.index is None else self.index.num_cached_pages(),
            peak_pages_in_use=self._peak_pages_in_use,
        )

    def check_invariants(self) -> None:
        """Every request's entry, the index and every page's reference count consistent
        (`consistency.check_page_counts`)."""
        self.allocator.check_invariants()
        if self.index is not None:
            self.index.check_invariants()
        scratch = self._scratch_page
        for request_id, request in self._requests.items():
            request.check_invariants(request_id, self.num_pages, scratch)
        check_page_counts(
            self.allocator,
            [request.pages for request in self._requests.values()],
            {} if self.index is None else self.index.pin_counts(),
            scratch_page=scratch,
            pages_in_use=self._pages_in_use(),
        )

    def _next_version(self) -> int:
        self._page_table_stamp += 1
        return self._page_table_stamp

    def _request(self, request_id: Hashable) -> OpenRequest:
        # The calls made for every sequence every step (reserve, publish, pages_and_version)
        # try `self._requests.get(request_id)` first and come here only for the error.
        return lookup_open(self._requests, request_id)

    def _pages_in_use(self) -> int:
        return self.num_pages - self.num_free_pages() - self.num_evictable_pages()

    def _note_usage(self) -> None:
        self._peak_pages_in_use = max(self._peak_pages_in_use, self._pages_in_use())

    def __repr__(self) -> str:
        return (
            f"KVCacheManager(num_pages={self.num_pages}, page_size={self.page_size}, "
            f"open={len(self._requests)}, free={self.num_free_pages()}, "
            f"evictable={self.num_evictable_pages()})"
        )
