"""The paged cache's consistency audits: the prefix tree's structure, and every page's reference
count against its holders. Tests run them after every operation (`check_invariants`); each walks
the whole tree or every page, so nothing on a step's path calls them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from astrai_batch.cache.allocator import PageAllocator
from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.radix_node import RadixNode


def check_prefix_tree(
    roots: Mapping[tuple[int, ...], RadixNode],
    node_by_page: Mapping[int, RadixNode],
    *,
    page_size: int,
    num_pinned: int,
    candidates: Iterable[RadixNode],
    allocator: PageAllocator,
) -> None:
    """Every cached node reachable with consistent links, counts and eviction candidates."""
    reached = 0
    pinned = 0
    unpinned_leaves: set[int] = set()
    pending: list[tuple[RadixNode | None, Mapping[tuple[int, ...], RadixNode]]] = [(None, roots)]
    while pending:
        parent, children = pending.pop()
        for key, node in children.items():
            where = f"node of page {node.page}"
            # a first page may carry a namespace before its tokens
            key_len = len(key) - (parent is None and len(key) == page_size + 1)
            if node.key != key or key_len != page_size:
                raise CacheUsageError(f"{where} is filed under a key that is not its own")
            if node.parent is not parent:
                raise CacheUsageError(f"{where} does not point back to its parent")
            if not node.cached or node_by_page.get(node.page) is not node:
                raise CacheUsageError(f"{where} is linked in but not registered as cached")
            if node.pins < 0:
                raise CacheUsageError(f"{where} has negative pin count {node.pins}")
            if node.pins < sum(child.pins for child in node.children.values()):
                raise CacheUsageError(f"{where} has fewer pins than its children together")
            if allocator.refcount(node.page) < 1:
                raise CacheUsageError(f"{where} caches a page the allocator holds as free")
            reached += 1
            if node.pins:
                pinned += 1
            elif not node.children:
                unpinned_leaves.add(id(node))
            pending.append((node, node.children))
    if reached != len(node_by_page):
        raise CacheUsageError(
            f"{len(node_by_page) - reached} cached pages are unreachable from the root"
        )
    if pinned != num_pinned:
        raise CacheUsageError(f"pinned-node count {num_pinned} != actual {pinned}")
    candidate_ids = {id(node) for node in candidates}
    if candidate_ids != unpinned_leaves:
        raise CacheUsageError(
            "eviction candidates differ from the unpinned leaves: "
            f"{len(candidate_ids)} candidates, {len(unpinned_leaves)} unpinned leaves"
        )


def check_page_counts(
    allocator: PageAllocator,
    page_tables: Iterable[Sequence[int]],
    pins: Mapping[int, int],
    *,
    scratch_page: int | None,
    pages_in_use: int,
) -> None:
    """Each page's count is (1 if cached) + its open holders (+ 1 for the scratch page, which
    no request holds and the index never caches); cached pages pinned per holder. `pins`: the
    pin count of every cached page; `pages_in_use`: what the free and evictable counts imply."""
    num_pages = allocator.num_pages
    holders = [0] * num_pages
    for pages in page_tables:
        for page in pages:
            holders[page] += 1
    if scratch_page is not None:
        if scratch_page in pins:
            raise CacheUsageError(f"the prefix index caches the scratch page {scratch_page}")
        holders[scratch_page] = 1
    for page in range(num_pages):
        cached = page in pins
        expected = holders[page] + int(cached)
        actual = allocator.refcount(page)
        if actual != expected:
            raise CacheUsageError(
                f"page {page} has reference count {actual}, expected {expected} "
                f"({holders[page]} open requests{' + the index' if cached else ''})"
            )
        if cached and pins[page] != holders[page]:
            raise CacheUsageError(
                f"cached page {page} is pinned {pins[page]} times "
                f"but held by {holders[page]} open requests"
            )
    in_use = sum(1 for count in holders if count)
    if in_use != pages_in_use:
        raise CacheUsageError(
            f"{in_use} pages are held by requests, but free/evictable counts imply {pages_in_use}"
        )
