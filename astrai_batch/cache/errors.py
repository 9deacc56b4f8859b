"""The cache layer's own error: a call the caller should never make."""

from __future__ import annotations

from astrai_batch.errors import AstraiBatchError


class CacheUsageError(AstraiBatchError, ValueError):
    """A cache call with bad arguments, or one that would corrupt the page bookkeeping.

    Examples: freeing a free page, opening a request twice, inserting fewer pages than tokens
    need, unpinning a match twice. These are bugs in the caller, not capacity problems: running
    out of pages is reported by return values (`None`, `False`), never by this exception.
    """
