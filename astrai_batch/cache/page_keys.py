"""A token sequence as pages: the keys of the prefix tree, and hashes naming its nodes.

The prefix index walks a prompt's full pages as tuples; the scheduler names "the node this
prompt's page `i` would be" by a hash of pages `0..i` without touching the index. Both come
from here so that they always agree on what a page is (full pages only, in order).
`jobs.prefix_stats` keys its own tree by packed bytes instead: it holds a whole input file's
pages, where 4 bytes a token matter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice


def full_pages(
    tokens: Sequence[int], page_size: int, max_tokens: int | None = None
) -> Iterator[tuple[int, ...]]:
    """The full pages of `tokens[:max_tokens]` as tuples, lazily; a partial page is dropped."""
    source = iter(tokens) if max_tokens is None else islice(tokens, max_tokens)
    # zip over one iterator repeated page_size times yields the full pages as tuples, in C.
    return zip(*[source] * page_size, strict=False)


def prefix_page_hashes(tokens: Sequence[int], page_size: int, namespace: int = 0) -> list[int]:
    """For each full page, a hash of it and every page before it: the prefix-tree node's name.
    `namespace` (a LoRA adapter: its keys and values differ) starts the chain elsewhere."""
    hashes = []
    running = 0 if namespace == 0 else hash(("namespace", namespace))
    for page in full_pages(tokens, page_size):
        running = hash((running, page))
        hashes.append(running)
    return hashes


def namespaced_key(page: tuple[int, ...], namespace: int) -> tuple[int, ...]:
    """The prefix tree's key of a sequence's first page: the page's tokens, preceded by the
    namespace unless it is 0 (the base model). A namespaced key is one longer than a page, so
    it never equals a base key, and every later page hangs below it: two namespaces share no
    node."""
    return page if namespace == 0 else (namespace, *page)


def namespaced_pages(keys: Iterator[tuple[int, ...]], namespace: int) -> Iterator[tuple[int, ...]]:
    """`keys` (a sequence's page keys from its first page on) with the first one namespaced
    (`namespaced_key`), lazily."""
    if namespace == 0:
        return keys
    return _prefixed(keys, namespace)


def _prefixed(keys: Iterator[tuple[int, ...]], namespace: int) -> Iterator[tuple[int, ...]]:
    for first in keys:
        yield namespaced_key(first, namespace)
        break
    yield from keys
