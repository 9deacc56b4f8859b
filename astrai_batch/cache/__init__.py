"""KV storage, its two layouts (paged with a radix prefix index, or contiguous seats).

This layer knows nothing of models or files: tokens are ints, pages are ints, and
`KVCacheManager` is the one place that maps requests to pages.
"""

from __future__ import annotations

from astrai_batch.cache.allocator import PageAllocator
from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.cache.layout import KV_LAYOUTS, KVLayout, make_layout
from astrai_batch.cache.manager import KVCacheManager
from astrai_batch.cache.prefix_index import PrefixIndex
from astrai_batch.cache.radix_node import PrefixMatch
from astrai_batch.cache.seats import SeatTable
from astrai_batch.cache.stats import CacheStats

__all__ = [
    "KV_LAYOUTS",
    "CacheStats",
    "CacheUsageError",
    "KVCacheManager",
    "KVLayout",
    "KVPool",
    "PageAllocator",
    "PrefixIndex",
    "PrefixMatch",
    "SeatTable",
    "make_layout",
]
