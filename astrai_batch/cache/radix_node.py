"""The pieces of the prefix index: tree nodes, match handles, and token normalisation."""

from __future__ import annotations

from collections.abc import Sequence


class RadixNode:
    """One cached full page: its tokens (`key`), the physical `page`, and tree links.

    `pins` counts the live matches whose path runs through this node; `last_access` is the
    index's logical clock when an insert or an unpin last touched it; `serial` is the
    creation order that breaks LRU ties; `cached` turns False once the node is evicted.
    """

    __slots__ = ("cached", "children", "key", "last_access", "page", "parent", "pins", "serial")

    def __init__(
        self,
        key: tuple[int, ...],
        page: int,
        parent: RadixNode | None,
        last_access: int,
        serial: int,
    ) -> None:
        self.key = key
        self.page = page
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.pins = 0
        self.last_access = last_access
        self.serial = serial
        self.cached = True

    def __repr__(self) -> str:
        return f"RadixNode(page={self.page}, pins={self.pins}, children={len(self.children)})"


class PrefixMatch:
    """A pinned cache hit: `pages` hold the K/V of the first `num_tokens` tokens.

    The handle keeps the deepest matched node so `PrefixIndex.unpin` can release the path
    without searching; it becomes inactive once unpinned or extended, so pins are never
    released twice. It holds no reference to its index: the index recognises its own
    matches by their node (see `PrefixIndex._check_owned_and_active`).
    """

    __slots__ = ("active", "namespace", "node", "num_tokens", "pages")

    def __init__(
        self, pages: list[int], num_tokens: int, node: RadixNode | None, namespace: int = 0
    ) -> None:
        self.pages = pages
        self.num_tokens = num_tokens
        self.node = node
        self.namespace = namespace  # see page_keys.namespaced_key
        self.active = True

    def __repr__(self) -> str:
        state = "pinned" if self.active else "released"
        return f"PrefixMatch(num_tokens={self.num_tokens}, pages={self.pages}, {state})"


def as_token_sequence(tokens: Sequence[int]) -> Sequence[int]:
    """`tokens` as a list or tuple of Python ints, so page slices hash and compare by value.

    Tensors and arrays are converted once: a tuple of 0-d tensors would hash by identity and
    never match anything.
    """
    if isinstance(tokens, (list, tuple)):
        return tokens
    to_list = getattr(tokens, "tolist", None)
    if to_list is not None:
        return to_list()
    return list(tokens)
