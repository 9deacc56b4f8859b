"""One open request of the paged layout: its page table, its pinned prefix match, its version.

`KVCacheManager` keeps one per request it has opened; the checks a single request's entry must
pass on its own (no page twice, no unknown page, no scratch page, a snapshot that matches its
version, pages that start with its published ones) live here with it.
"""

from __future__ import annotations

from collections.abc import Hashable

from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.radix_node import PrefixMatch


class OpenRequest:
    """A request's pages by position, and its pinned match over the published leading pages.

    `lookup` holds the (hit, missed) tokens of its `open` until its first successful
    `reserve`: only then is the request admitted and the lookup counted. `version` changes
    whenever `pages` does (see `KVCacheManager.pages_version`); `snapshot` is an immutable
    copy of `pages` taken at `snapshot[0] == version`, so a table that did not change is
    handed out every step without copying it.
    """

    __slots__ = ("lookup", "match", "pages", "snapshot", "version")

    def __init__(
        self,
        match: PrefixMatch | None,
        pages: list[int],
        lookup: tuple[int, int] | None,
        version: int,
    ) -> None:
        self.match = match
        self.pages = pages
        self.lookup = lookup
        self.version = version
        self.snapshot: tuple[int, tuple[int, ...]] | None = None

    def num_published_pages(self) -> int:
        return 0 if self.match is None else len(self.match.pages)

    def check_invariants(
        self, request_id: Hashable, num_pages: int, scratch_page: int | None
    ) -> None:
        """This entry is consistent on its own; the page counts across entries are the
        manager's to check."""
        if len(set(self.pages)) != len(self.pages):
            raise CacheUsageError(f"request {request_id!r} holds a page twice")
        for page in self.pages:
            if not 0 <= page < num_pages:
                raise CacheUsageError(f"request {request_id!r} holds unknown page {page}")
            if page == scratch_page:
                raise CacheUsageError(f"request {request_id!r} holds the scratch page {page}")
        snapshot = self.snapshot
        current = snapshot is not None and snapshot[0] == self.version
        if current and list(snapshot[1]) != self.pages:
            raise CacheUsageError(f"request {request_id!r} changed its pages without a new version")
        match = self.match
        if match is not None:
            if not match.active:
                raise CacheUsageError(f"request {request_id!r} keeps a released match")
            if self.pages[: len(match.pages)] != match.pages:
                raise CacheUsageError(
                    f"request {request_id!r} has pages {self.pages} that do not start "
                    f"with its published pages {match.pages}"
                )
