"""Ideal prefix-reuse statistics of a prompt set: what `astrai-batch plan` prints.

The ideal is a page-granular prefix cache of infinite size, matching exactly, with the
rules of the engine's radix cache:

* A row of L tokens may reuse at most `((L - 1) // page_size) * page_size` tokens: only
  full pages are cached, and the last prompt token is always computed to get the logits
  of the first output token. So a row whose length is a multiple of the page size always
  computes its last page, even when that page is cached.
* After a row runs, the cache holds all of its `L // page_size` full pages, the last one
  included: the row computed it, so the cache inserts it.
* A row reuses its longest run of leading full pages that are already cached.

With these rules the total depends on the order rows run in, but only through rows whose
length is a multiple of the page size: if such a row runs after a longer row that cached
its last page, it computes that page again, whereas in the other order the longer row
would have reused it. The statistics report the best order, which is the sorted order
`plan_window` uses (a prompt that is a prefix of another runs first). In that order every
cached page is computed exactly once, except that each row ending exactly on it computes
it again when it is not the first to do so:

    unique_tokens = sum over rows of (L mod page_size)
                  + page_size * sum over trie pages v of max(rows ending exactly on v, 1)

where the trie holds every row's full pages. No order computes less, so this is the ideal;
in an order where no row ends exactly on a page boundary it is also what any order gives.

Memory is bounded by the trie: one node per distinct (prefix, page) pair, each about
200-400 bytes with a 16-token page, so a million short rows fit in a few hundred MB.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from astrai_batch.checks import require_positive_int
from astrai_batch.errors import AstraiBatchError, ConfigError, InputError

PREVIEW_TOKENS = 32
# Pages are stored as big-endian uint32 bytes: compact dict keys that hash fast, and whose
# byte order is the numeric lexicographic order of the token ids.
_TOKEN_TYPECODE = "I"
_TOKEN_BYTES = 4
_MAX_TOKEN_ID = 2**32 - 1


@dataclass(frozen=True)
class SharedPrefix:
    """A maximal full-page prefix shared by at least two rows."""

    num_tokens: int
    num_rows: int
    preview_token_ids: tuple[int, ...]  # the first up to PREVIEW_TOKENS tokens

    @property
    def tokens_saved(self) -> int:
        """The ranking key: prefill tokens saved if every row but one reuses the prefix."""
        return (self.num_rows - 1) * self.num_tokens

    def to_dict(self) -> dict[str, object]:
        return {
            "num_tokens": self.num_tokens,
            "num_rows": self.num_rows,
            "preview_token_ids": list(self.preview_token_ids),
        }


@dataclass(frozen=True)
class PrefixStats:
    """Prefill work of a prompt set under the ideal prefix cache (see the module doc)."""

    page_size: int
    rows: int
    prompt_tokens: int
    reusable_tokens: int
    unique_tokens: int  # prompt_tokens - reusable_tokens: the prefill an ideal engine computes
    predicted_prefill_saving: float  # reusable_tokens / prompt_tokens, 0.0 without tokens
    # Maximal shared prefixes (extending one by a page loses a row), most tokens saved first;
    # ties go to the longer prefix, then to the lexicographically smaller one.
    top_shared_prefixes: tuple[SharedPrefix, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "page_size": self.page_size,
            "rows": self.rows,
            "prompt_tokens": self.prompt_tokens,
            "reusable_tokens": self.reusable_tokens,
            "unique_tokens": self.unique_tokens,
            "predicted_prefill_saving": self.predicted_prefill_saving,
            "top_shared_prefixes": [prefix.to_dict() for prefix in self.top_shared_prefixes],
        }

    def check_invariants(self) -> None:
        """Raise AstraiBatchError if the counts contradict each other."""
        if not 0 <= self.reusable_tokens <= self.prompt_tokens:
            raise AstraiBatchError(
                f"reusable_tokens {self.reusable_tokens} outside [0, {self.prompt_tokens}]"
            )
        if self.unique_tokens != self.prompt_tokens - self.reusable_tokens:
            raise AstraiBatchError(
                f"unique_tokens {self.unique_tokens} != prompt_tokens {self.prompt_tokens}"
                f" - reusable_tokens {self.reusable_tokens}"
            )
        expected = self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        if self.predicted_prefill_saving != expected:
            raise AstraiBatchError(
                f"predicted_prefill_saving {self.predicted_prefill_saving} != {expected}"
            )
        keys = [(p.tokens_saved, p.num_tokens) for p in self.top_shared_prefixes]
        if keys != sorted(keys, reverse=True):
            raise AstraiBatchError(f"top_shared_prefixes are not ranked: {keys}")
        for prefix in self.top_shared_prefixes:
            if prefix.num_rows < 2 or prefix.num_tokens % self.page_size or not prefix.num_tokens:
                raise AstraiBatchError(f"not a shared full-page prefix: {prefix}")
            if len(prefix.preview_token_ids) != min(PREVIEW_TOKENS, prefix.num_tokens):
                raise AstraiBatchError(f"preview has the wrong length: {prefix}")


class _PageNode:
    """One full page in the trie; its key in the parent's `children` is the page's bytes."""

    __slots__ = ("children", "forced_ends", "rows")

    def __init__(self) -> None:
        self.rows = 0  # rows whose full pages include this one
        self.forced_ends = 0  # rows of length a multiple of page_size ending on this page
        self.children: dict[bytes, _PageNode] | None = None


def _tokens_of(page_bytes: bytes) -> list[int]:
    tokens = array(_TOKEN_TYPECODE)
    tokens.frombytes(page_bytes)
    if sys.byteorder == "little":
        tokens.byteswap()
    # content ids back to what the engine holds (negative: `packed_ids`)
    return [t - 2**32 if t >= 2**31 else t for t in tokens.tolist()]


class PrefixStatsBuilder:
    """Streams rows of token ids into a trie of pages and reports `PrefixStats`."""

    def __init__(self, page_size: int, top: int = 10) -> None:
        require_positive_int("page_size", page_size)
        if top < 0:
            raise ConfigError(f"top must be >= 0, got {top}")
        if array(_TOKEN_TYPECODE).itemsize != _TOKEN_BYTES:
            raise AstraiBatchError(f"array typecode {_TOKEN_TYPECODE!r} is not 4 bytes here")
        self._page_size = page_size
        self._page_bytes = page_size * _TOKEN_BYTES
        self._top = top
        self._root: dict[bytes, _PageNode] = {}
        self._rows = 0
        self._prompt_tokens = 0
        self._tail_tokens = 0  # tokens after each row's last full page: never cached
        self._computed_pages = 0  # sum over trie pages of max(forced_ends, 1)

    def add(self, token_ids: Sequence[int]) -> None:
        """Add one row (the prompt's token ids as the engine will prefill them)."""
        try:
            packed = packed_ids(token_ids)
        except (OverflowError, TypeError) as exc:
            raise InputError(
                f"row {self._rows}: token ids must be integers in [0, {_MAX_TOKEN_ID}]"
            ) from exc
        if sys.byteorder == "little":
            packed.byteswap()
        data = packed.tobytes()
        length = len(packed)
        full_pages = length // self._page_size
        ends_on_boundary = full_pages > 0 and length % self._page_size == 0

        self._rows += 1
        self._prompt_tokens += length
        self._tail_tokens += length - full_pages * self._page_size
        children = self._root
        node = None
        for index in range(full_pages):
            start = index * self._page_bytes
            key = data[start : start + self._page_bytes]
            if node is not None:
                if node.children is None:
                    node.children = {}
                children = node.children
            child = children.get(key)
            if child is None:
                child = _PageNode()
                children[key] = child
                self._computed_pages += 1
            child.rows += 1
            node = child
        if ends_on_boundary and node is not None:
            node.forced_ends += 1
            if node.forced_ends >= 2:
                self._computed_pages += 1

    def add_all(self, rows: Iterable[Sequence[int]]) -> None:
        for token_ids in rows:
            self.add(token_ids)

    def result(self) -> PrefixStats:
        """The statistics of the rows added so far (the builder stays usable)."""
        unique = self._tail_tokens + self._computed_pages * self._page_size
        reusable = self._prompt_tokens - unique
        return PrefixStats(
            page_size=self._page_size,
            rows=self._rows,
            prompt_tokens=self._prompt_tokens,
            reusable_tokens=reusable,
            unique_tokens=unique,
            predicted_prefill_saving=reusable / self._prompt_tokens if self._prompt_tokens else 0.0,
            top_shared_prefixes=self._top_shared_prefixes(),
        )

    def check_invariants(self) -> None:
        """Raise AstraiBatchError if the trie's counts are inconsistent with the totals."""
        computed_pages = 0
        rows_with_pages = sum(node.rows for node in self._root.values())
        if rows_with_pages > self._rows:
            raise AstraiBatchError(f"{rows_with_pages} rows in the trie, {self._rows} added")
        for node, path in self._walk():
            computed_pages += max(node.forced_ends, 1)
            continuing = sum(child.rows for child in (node.children or {}).values())
            if node.rows < 1 or continuing + node.forced_ends > node.rows:
                raise AstraiBatchError(
                    f"page at depth {len(path)}: {node.rows} rows, {continuing} continue,"
                    f" {node.forced_ends} end on it"
                )
        if computed_pages != self._computed_pages:
            raise AstraiBatchError(
                f"computed pages {self._computed_pages} != {computed_pages} counted in the trie"
            )

    def _walk(self) -> Iterator[tuple[_PageNode, list[bytes]]]:
        """Every trie page with its path of page keys, in lexicographic order of the path.

        The yielded list is reused by the walk: read it before advancing.
        """
        stack = [iter(sorted(self._root.items()))]
        path: list[bytes] = []
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
                if path:
                    path.pop()
                continue
            key, node = entry
            path.append(key)
            yield node, path
            if node.children:
                stack.append(iter(sorted(node.children.items())))
            else:
                path.pop()

    def _top_shared_prefixes(self) -> tuple[SharedPrefix, ...]:
        if self._top == 0:
            return ()
        preview_pages = -(-PREVIEW_TOKENS // self._page_size)
        # A min-heap of the best `top` so far, keyed so that its root is the worst kept.
        heap: list[tuple[int, int, int, SharedPrefix]] = []
        for walk_index, (node, path) in enumerate(self._walk()):
            if node.rows < 2:
                continue
            if node.children and max(child.rows for child in node.children.values()) == node.rows:
                continue  # not maximal: the next page is shared by the same rows
            num_tokens = len(path) * self._page_size
            key = ((node.rows - 1) * num_tokens, num_tokens, -walk_index)
            if len(heap) == self._top and key <= heap[0][:3]:
                continue
            preview = _tokens_of(b"".join(path[:preview_pages]))[:PREVIEW_TOKENS]
            entry = (*key, SharedPrefix(num_tokens, node.rows, tuple(preview)))
            if len(heap) < self._top:
                heapq.heappush(heap, entry)
            else:
                heapq.heapreplace(heap, entry)
        return tuple(entry[3] for entry in sorted(heap, reverse=True))


def ideal_prefix_stats(
    rows: Iterable[Sequence[int]], *, page_size: int, top: int = 10
) -> PrefixStats:
    """`PrefixStats` of rows of token ids under the ideal prefix cache."""
    builder = PrefixStatsBuilder(page_size, top)
    builder.add_all(rows)
    return builder.result()


def packed_ids(token_ids: Sequence[int]) -> array:
    """`token_ids` as unsigned 32-bit words; an image's content ids
    (`engine.vision.image_inputs`: -2**31..-1) as 2**31 and above, where no vocabulary id is,
    so pages keep them apart exactly. OverflowError or TypeError for anything else."""
    try:
        return array(_TOKEN_TYPECODE, token_ids)
    except OverflowError:
        return array(_TOKEN_TYPECODE, [t + 2**32 if -(2**31) <= t < 0 else t for t in token_ids])
