"""Which cached page to evict next: the least recently used unpinned leaf of the prefix tree."""

from __future__ import annotations

import heapq

from astrai_batch.cache.radix_node import RadixNode

# (last_access, serial, push number, node): the push number keeps entries comparable without
# ever comparing nodes.
_Entry = tuple[int, int, int, RadixNode]


class EvictionQueue:
    """A min-heap of eviction candidates ordered by (last access, creation order).

    Nodes are pushed when they become unpinned leaves and never removed: an entry whose node
    was since evicted, pinned, given a child or touched again is stale and skipped when popped.
    Stale entries are swept out whenever they outnumber the cached pages, so the heap stays
    O(cached pages) and each eviction costs O(log n) instead of a scan of the tree.
    """

    __slots__ = ("_heap", "_pushes")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._pushes = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def push(self, node: RadixNode, num_cached: int) -> None:
        heap = self._heap
        if len(heap) > 2 * num_cached + 64:
            heap[:] = [entry for entry in heap if _is_current(entry)]
            heapq.heapify(heap)
        self._pushes += 1
        heapq.heappush(heap, (node.last_access, node.serial, self._pushes, node))

    def pop(self) -> RadixNode | None:
        """The least recently used evictable leaf, taken off the queue; None when none is left."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            if _is_current(entry):
                return entry[3]
        return None

    def candidates(self) -> list[RadixNode]:
        """The nodes with a current entry, for invariant checks."""
        return [entry[3] for entry in self._heap if _is_current(entry)]

    def clear(self) -> None:
        self._heap.clear()


def _is_current(entry: _Entry) -> bool:
    """Whether an entry still describes an evictable leaf as it was when pushed."""
    node = entry[3]
    return node.cached and node.pins == 0 and not node.children and entry[0] == node.last_access
