"""The cache layer's own error: a call the caller should never make."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

from astrai_batch.errors import AstraiBatchError

_Entry = TypeVar("_Entry")


class CacheUsageError(AstraiBatchError, ValueError):
    """A cache call with bad arguments, or one that would corrupt the page bookkeeping.

    Examples: freeing a free page, opening a request twice, inserting fewer pages than tokens
    need, unpinning a match twice. These are bugs in the caller, not capacity problems: running
    out of pages is reported by return values (`None`, `False`), never by this exception.
    """


def lookup_open(table: Mapping[Hashable, _Entry], request_id: Hashable) -> _Entry:
    """`table[request_id]`, or the usage error both layouts give for a request not open."""
    entry = table.get(request_id)
    if entry is None:
        raise CacheUsageError(f"request {request_id!r} is not open")
    return entry
