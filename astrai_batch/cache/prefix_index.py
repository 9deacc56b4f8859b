"""A page-granular radix tree over token ids: which cached pages hold a given prompt prefix.

Each node is one full page: its key is the tuple of that page's `page_size` token ids and its
value the physical page that holds their K/V. A page's K/V depends on every token before it, so
a node is only reachable through the exact tokens of all earlier pages; matching is plain
dictionary lookups of page-sized tuples, never per-token Python work. A `namespace` (a LoRA
adapter, whose K/V differ from the base model's for the same tokens) is part of the first
page's key (`page_keys.namespaced_key`), so two namespaces never share a node.

Reference counting: the index holds one allocator reference on every page it caches. Pinning:
a match pins every node on its path (root to deepest hit) until it is unpinned, so a node is
pinned exactly when some live match passes through it, and an unpinned node has an unpinned
subtree. Eviction removes unpinned leaves, least recently used first (a logical clock, ties by
insertion order), so a cached descendant never becomes unreachable.

`num_evictable_pages()` counts the unpinned nodes: exactly the pages repeated leaf eviction can
drop. They are freed (count 0) when every other holder of a cached page also pins its node, which
`KVCacheManager` guarantees; callers that use the index directly and keep a page reference without
a pin see such a page dropped from the index but not freed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from astrai_batch.cache.allocator import PageAllocator
from astrai_batch.cache.consistency import check_prefix_tree
from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.eviction_queue import EvictionQueue
from astrai_batch.cache.page_keys import full_pages, namespaced_key, namespaced_pages
from astrai_batch.cache.radix_node import PrefixMatch, RadixNode, as_token_sequence
from astrai_batch.checks import require_positive_int


class PrefixIndex:
    """Radix tree of cached full pages keyed by their tokens, with pins and LRU leaf eviction."""

    def __init__(self, page_size: int, allocator: PageAllocator) -> None:
        require_positive_int("page_size", page_size)
        self.page_size = page_size
        self.allocator = allocator
        self._roots: dict[tuple[int, ...], RadixNode] = {}
        self._node_by_page: dict[int, RadixNode] = {}
        self._num_pinned = 0
        self._clock = 0
        self._next_serial = 0
        self._eviction_queue = EvictionQueue()

    def num_cached_pages(self) -> int:
        return len(self._node_by_page)

    def num_evictable_pages(self) -> int:
        """Unpinned nodes: the pages that evicting leaves over and over can remove."""
        return len(self._node_by_page) - self._num_pinned

    def pin_counts(self) -> dict[int, int]:
        """Pin count of every cached page, by page id."""
        return {page: node.pins for page, node in self._node_by_page.items()}

    def match(
        self, tokens: Sequence[int], max_tokens: int | None = None, namespace: int = 0
    ) -> PrefixMatch:
        """The longest run of cached full pages that `tokens[:max_tokens]` starts with, pinned.

        Only whole pages match, so at most `len(tokens) // page_size` pages. Every node on the
        path is pinned until `unpin`, which also stamps the path's LRU time: a pinned node
        cannot be evicted, so the moment its last user lets go is what recency should mean.
        """
        page_keys = self._page_keys(tokens, max_tokens, namespace)
        children = self._roots
        node: RadixNode | None = None
        pages: list[int] = []
        newly_pinned = 0
        for key in page_keys:
            child = children.get(key)
            if child is None:
                break
            if child.pins == 0:
                newly_pinned += 1
            child.pins += 1
            pages.append(child.page)
            node = child
            children = child.children
        self._num_pinned += newly_pinned
        return PrefixMatch(pages, len(pages) * self.page_size, node, namespace)

    def cached_prefix_length(
        self, tokens: Sequence[int], max_tokens: int | None = None, namespace: int = 0
    ) -> int:
        """How many leading tokens `match` would hit now; pins, touches and counts nothing.

        For scoring waiting requests: a pin or LRU stamp there would let requests that were
        only looked at steer eviction.
        """
        children = self._roots
        num_pages = 0
        for key in self._page_keys(tokens, max_tokens, namespace):
            child = children.get(key)
            if child is None:
                break
            num_pages += 1
            children = child.children
        return num_pages * self.page_size

    def unpin(self, match: PrefixMatch) -> None:
        """Release the pins `match` holds; a match can be unpinned (or extended) only once."""
        self._retire(match)
        node = match.node
        self._clock += 1
        clock = self._clock
        while node is not None:
            if node.pins <= 0:
                raise CacheUsageError(f"page {node.page} unpinned more often than pinned")
            node.pins -= 1
            node.last_access = clock
            if node.pins == 0:
                self._num_pinned -= 1
                if not node.children:
                    self._push(node)
            node = node.parent

    def extend(
        self, match: PrefixMatch, tokens: Sequence[int], pages: Sequence[int]
    ) -> PrefixMatch:
        """Insert the full pages of `tokens` below `match` and return the longer, pinned match.

        `tokens` must start with the tokens `match` was made for and `pages` is the caller's
        whole page list (position 0 onwards). `match` is consumed: its pins move to the result,
        whose `pages` are canonical: where an identical page was already cached, that page
        rather than the caller's. Costs O(new pages), not O(len(tokens)).
        """
        self._check_owned_and_active(match)
        tokens = as_token_sequence(tokens)
        page_size = self.page_size
        num_full = len(tokens) // page_size
        first = len(match.pages)
        if num_full < first:
            raise CacheUsageError(
                f"extend got {len(tokens)} tokens, fewer than the {match.num_tokens} matched"
            )
        if match.node is not None:
            last_key = tuple(tokens[(first - 1) * page_size : first * page_size])
            if first == 1:
                last_key = namespaced_key(last_key, match.namespace)
            if match.node.key != last_key:
                raise CacheUsageError("extend got tokens that do not continue the matched prefix")
        self._check_enough_pages(pages, num_full)
        self._clock += 1
        new_pages, deepest = self._add_path(
            match.node, first, tokens, num_full, pages, pin=True, namespace=match.namespace
        )
        match.active = False
        return PrefixMatch(match.pages + new_pages, num_full * page_size, deepest, match.namespace)

    def evict(self, num_pages: int) -> list[int]:
        """Evict unpinned leaves, least recently used first, until `num_pages` pages are freed.

        A parent whose last child goes becomes a candidate in the same call. Returns the pages
        whose reference count reached 0; fewer than asked when nothing evictable is left.
        """
        if num_pages < 0:
            raise CacheUsageError(f"cannot evict a negative number of pages ({num_pages})")
        freed: list[int] = []
        decref = self.allocator.decref
        while len(freed) < num_pages:
            node = self._eviction_queue.pop()
            if node is None:
                break
            self._remove(node)
            freed.extend(decref((node.page,)))
            parent = node.parent
            if parent is not None and parent.pins == 0 and not parent.children:
                self._push(parent)
        return freed

    def check_invariants(self) -> None:
        """Every cached node reachable with consistent links, counts and eviction candidates."""
        check_prefix_tree(
            self._roots,
            self._node_by_page,
            page_size=self.page_size,
            num_pinned=self._num_pinned,
            candidates=self._eviction_queue.candidates(),
            allocator=self.allocator,
        )

    def _add_path(
        self,
        start: RadixNode | None,
        first: int,
        tokens: Sequence[int],
        num_full: int,
        pages: Sequence[int],
        *,
        pin: bool,
        namespace: int = 0,
    ) -> tuple[list[int], RadixNode | None]:
        """Walk/extend the path below `start` for pages `first..num_full-1`; canonical pages."""
        page_size = self.page_size
        span = tokens[first * page_size : num_full * page_size]
        page_keys = full_pages(span, page_size)
        if first == 0:
            page_keys = namespaced_pages(page_keys, namespace)
        children = self._roots if start is None else start.children
        existing: list[RadixNode] = []
        new_keys: list[tuple[int, ...]] = []
        for key in page_keys:
            child = children.get(key)
            if child is None:
                new_keys = [key, *page_keys]  # the rest of the same iterator: pages below
                break
            existing.append(child)
            children = child.children
        new_pages = list(pages[first + len(existing) : num_full])
        self._check_new_pages(new_pages)
        # Validated: from here on nothing raises, so the tree never ends up half-updated.
        self.allocator.incref(new_pages)
        clock = self._clock
        canonical: list[int] = []
        for hit in existing:
            if pin:
                if hit.pins == 0:
                    self._num_pinned += 1
                hit.pins += 1
            hit.last_access = clock
            canonical.append(hit.page)
        node = existing[-1] if existing else start
        serial = self._next_serial
        node_by_page = self._node_by_page
        for key, page in zip(new_keys, new_pages, strict=True):
            child = RadixNode(key, page, node, clock, serial)
            serial += 1
            if pin:
                child.pins = 1
            children[key] = child
            node_by_page[page] = child
            canonical.append(page)
            node = child
            children = child.children
        self._next_serial = serial
        if pin:
            self._num_pinned += len(new_pages)
        elif node is not None and node is not start and node.pins == 0 and not node.children:
            self._push(node)  # a new leaf, or an existing one whose access time just changed
        return canonical, node

    def _page_keys(
        self, tokens: Sequence[int], max_tokens: int | None, namespace: int = 0
    ) -> Iterator[tuple[int, ...]]:
        """The keys of the full pages of `tokens[:max_tokens]`, lazily."""
        tokens = as_token_sequence(tokens)
        if max_tokens is not None and max_tokens < 0:
            raise CacheUsageError(f"max_tokens must be >= 0, got {max_tokens}")
        return namespaced_pages(full_pages(tokens, self.page_size, max_tokens), namespace)

    def _check_new_pages(self, new_pages: list[int]) -> None:
        if len(set(new_pages)) != len(new_pages):
            raise CacheUsageError(f"the same page appears twice among pages {new_pages}")
        for page in new_pages:
            if page in self._node_by_page:
                raise CacheUsageError(f"page {page} is already cached for other tokens")
            if not 0 <= page < self.allocator.num_pages or self.allocator.refcount(page) < 1:
                raise CacheUsageError(f"page {page} is not an allocated page")

    def _check_enough_pages(self, pages: Sequence[int], num_full: int) -> None:
        if len(pages) < num_full:
            raise CacheUsageError(
                f"{num_full} full pages of tokens need {num_full} pages, got {len(pages)}"
            )

    def _check_owned_and_active(self, match: PrefixMatch) -> None:
        # A match's pins live on its node's path; a node this index does not hold (another
        # index's) would have its pins released in the wrong tree.
        node = match.node
        if node is not None and self._node_by_page.get(node.page) is not node:
            raise CacheUsageError("this match belongs to a different PrefixIndex")
        if not match.active:
            raise CacheUsageError("this match was already unpinned or extended")

    def _retire(self, match: PrefixMatch) -> None:
        self._check_owned_and_active(match)
        match.active = False

    def _push(self, node: RadixNode) -> None:
        self._eviction_queue.push(node, len(self._node_by_page))

    def _remove(self, node: RadixNode) -> None:
        siblings = self._roots if node.parent is None else node.parent.children
        del siblings[node.key]
        del self._node_by_page[node.page]
        node.cached = False

    def __repr__(self) -> str:
        return (
            f"PrefixIndex(page_size={self.page_size}, cached={self.num_cached_pages()}, "
            f"evictable={self.num_evictable_pages()})"
        )
