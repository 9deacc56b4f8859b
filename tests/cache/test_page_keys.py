"""Pages of a token sequence: the prefix index's keys and the scheduler's node names agree."""

from __future__ import annotations

from astrai_batch.cache import PageAllocator, PrefixIndex
from astrai_batch.cache.page_keys import full_pages, prefix_page_hashes


def test_full_pages_drop_the_partial_page_and_respect_the_limit() -> None:
    assert list(full_pages([1, 2, 3, 4, 5], 2)) == [(1, 2), (3, 4)]
    assert list(full_pages([1, 2, 3, 4, 5], 2, max_tokens=3)) == [(1, 2)]
    assert list(full_pages([1], 2)) == []


def test_a_page_hash_names_the_whole_prefix_like_a_tree_node() -> None:
    a = prefix_page_hashes([1, 2, 3, 4, 5, 6], 2)
    b = prefix_page_hashes([1, 2, 3, 4, 9, 9, 7], 2)
    c = prefix_page_hashes([9, 9, 3, 4], 2)
    assert len(a) == 3 and len(b) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    assert c[1] != a[1]  # the same page after another first page is another node


def test_hashes_agree_with_the_prefix_index_on_shared_pages() -> None:
    """Two prompts share a node of the index exactly when their page hashes agree."""
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8], [1, 2, 9, 9, 5, 6], [3, 4, 5, 6]]
    index = PrefixIndex(2, PageAllocator(32))
    for tokens in prompts:
        own = index.allocator.allocate(3)
        index.unpin(index.extend(index.match(tokens, 0), tokens, own))
        index.allocator.decref(own)
    for first in prompts:
        for second in prompts:
            first_hashes = prefix_page_hashes(first, 2)
            second_hashes = prefix_page_hashes(second, 2)
            shared = index.cached_prefix_length(first) if first == second else None
            for depth in range(min(len(first_hashes), len(second_hashes))):
                same_node = first[: 2 * depth + 2] == second[: 2 * depth + 2]
                assert (first_hashes[depth] == second_hashes[depth]) == same_node
            if shared is not None:
                assert shared == 2 * len(first_hashes)
    index.check_invariants()
