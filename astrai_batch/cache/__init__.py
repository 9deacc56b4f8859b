"""Paged KV storage, reference-counted page allocation, and the radix prefix index.

This layer knows nothing of models or files: tokens are ints, pages are ints, and
`KVCacheManager` is the one place that maps requests to pages.
"""

from __future__ import annotations

from astrai_batch.cache.allocator import PageAllocator
from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.cache.manager import KVCacheManager
from astrai_batch.cache.prefix_index import PrefixIndex
from astrai_batch.cache.radix_node import PrefixMatch
from astrai_batch.cache.stats import CacheStats

__all__ = [
    "CacheStats",
    "CacheUsageError",
    "KVCacheManager",
    "KVPool",
    "PageAllocator",
    "PrefixIndex",
    "PrefixMatch",
]
