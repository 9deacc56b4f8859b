"""Prefix grouping of a window and the ideal prefix-reuse statistics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astrai_batch.errors import AstraiBatchError, ConfigError, InputError
from astrai_batch.jobs.planning.prefix_order import PlannedRow, WindowPlan, plan_window
from astrai_batch.jobs.planning.prefix_stats import (
    PrefixStats,
    PrefixStatsBuilder,
    SharedPrefix,
    ideal_prefix_stats,
)

# ---------------------------------------------------------------------------- plan_window

WINDOW = [
    [5, 6, 7],  # 0
    [1, 2, 3, 4],  # 1
    [5, 6, 1],  # 2
    [1, 2],  # 3
    [9],  # 4: shorter than a page
    [1, 2, 3, 4],  # 5: equal to row 1
    [1, 3],  # 6
]


def test_plan_window_sorts_by_token_ids_and_groups_by_first_page() -> None:
    plan = plan_window(WINDOW, page_size=2)
    # Sorted: [1,2] [1,2,3,4] [1,2,3,4] [1,3] [5,6,1] [5,6,7] [9]; row 1 before its equal row 5.
    assert plan.order == (3, 1, 5, 6, 2, 0, 4)
    # First pages (1,2) -> 0, (1,3) -> 1, (5,6) -> 2; [9] has no full page -> 3.
    assert plan.prefix_group == (2, 0, 2, 0, 3, 0, 1)
    assert plan.num_groups == 4
    plan.check_invariants()


def test_plan_window_offsets_group_ids() -> None:
    plan = plan_window(WINDOW, page_size=2, group_offset=10)
    assert plan.order == (3, 1, 5, 6, 2, 0, 4)
    assert plan.prefix_group == (12, 10, 12, 10, 13, 10, 11)
    assert plan.num_groups == 4
    plan.check_invariants()


def test_plan_window_without_grouping_keeps_input_order() -> None:
    plan = plan_window(WINDOW, page_size=2, enable_grouping=False)
    assert plan.order == (0, 1, 2, 3, 4, 5, 6)
    # Groups are still reported, numbered in input order: (5,6) 0, (1,2) 1, [9] 2, (1,3) 3.
    assert plan.prefix_group == (0, 1, 0, 1, 2, 1, 3)
    assert plan.num_groups == 4
    plan.check_invariants()


def test_plan_window_page_size_decides_the_groups() -> None:
    # With 3-token pages [1,2,3,4] twice share a page; [1,2] [1,3] [9] are shorter than one.
    plan = plan_window(WINDOW, page_size=3)
    assert plan.order == (3, 1, 5, 6, 2, 0, 4)
    assert plan.prefix_group == (4, 1, 3, 0, 5, 1, 2)
    assert plan.num_groups == 6


def test_rows_shorter_than_a_page_are_groups_of_their_own() -> None:
    plan = plan_window([[7], [7], [7, 8]], page_size=2)
    assert plan.order == (0, 1, 2)
    assert plan.prefix_group == (0, 1, 2)
    assert plan.num_groups == 3


def test_plan_window_is_stable_for_equal_prompts() -> None:
    plan = plan_window([[4, 4], [3], [4, 4], [4, 4], [3]], page_size=1)
    assert plan.order == (1, 4, 0, 2, 3)
    assert plan.prefix_group == (1, 0, 1, 1, 0)


def test_empty_window() -> None:
    plan = plan_window([], page_size=16, group_offset=3)
    assert plan == WindowPlan(order=(), prefix_group=(), num_groups=0)
    plan.check_invariants()


def test_planned_rows_follow_execution_order() -> None:
    plan = plan_window([[2, 2], [1, 1]], page_size=2, group_offset=5)
    assert plan.planned_rows() == (PlannedRow(1, 5), PlannedRow(0, 6))


def test_plan_window_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match=r"^page_size must be >= 1, got 0$"):
        plan_window([[1]], page_size=0)
    with pytest.raises(ConfigError, match=r"^group_offset must be >= 0, got -1$"):
        plan_window([[1]], page_size=1, group_offset=-1)


def test_window_plan_invariants_catch_broken_plans() -> None:
    with pytest.raises(AstraiBatchError, match=r"^order is not a permutation of range\(2\)"):
        WindowPlan(order=(0, 0), prefix_group=(0, 0), num_groups=1).check_invariants()
    with pytest.raises(AstraiBatchError, match=r"^num_groups is 2 but 1 distinct groups occur$"):
        WindowPlan(order=(0, 1), prefix_group=(0, 0), num_groups=2).check_invariants()
    with pytest.raises(AstraiBatchError, match=r"^group ids are not dense"):
        WindowPlan(order=(0, 1), prefix_group=(1, 0), num_groups=2).check_invariants()


prompt_sets = st.lists(st.lists(st.integers(0, 2), max_size=12), max_size=14)


@settings(max_examples=200, deadline=None)
@given(prompts=prompt_sets, page_size=st.integers(1, 4), grouping=st.booleans())
def test_plan_window_properties(prompts: list[list[int]], page_size: int, grouping: bool) -> None:
    plan = plan_window(prompts, page_size=page_size, enable_grouping=grouping)
    plan.check_invariants()
    if grouping:
        executed = [(prompts[position], position) for position in plan.order]
        assert executed == sorted(executed)  # sorted by tokens, equal prompts in input order
    for first in range(len(prompts)):
        for second in range(first + 1, len(prompts)):
            a, b = prompts[first], prompts[second]
            share_a_page = len(a) >= page_size <= len(b) and a[:page_size] == b[:page_size]
            same_group = plan.prefix_group[first] == plan.prefix_group[second]
            assert same_group == share_a_page
    if grouping:  # each group is one contiguous run of the execution order
        runs = [plan.prefix_group[position] for position in plan.order]
        assert runs == sorted(runs)


# ----------------------------------------------------------------------- prefix statistics


def naive_reusable(rows: list[list[int]], page_size: int) -> int:
    """Tokens reused when rows run in this order, each against every earlier row: O(n^2)."""
    total = 0
    for index, row in enumerate(rows):
        bound = max(0, len(row) - 1) // page_size  # full pages, last token always computed
        best = 0
        for earlier in rows[:index]:
            cached = len(earlier) // page_size  # an earlier row cached all its full pages
            pages = 0
            while (
                pages < min(bound, cached)
                and row[pages * page_size : (pages + 1) * page_size]
                == earlier[pages * page_size : (pages + 1) * page_size]
            ):
                pages += 1
            best = max(best, pages)
        total += best * page_size
    return total


def naive_shared_prefixes(rows: list[list[int]], page_size: int) -> list[SharedPrefix]:
    """Every maximal full-page prefix of >= 2 rows, best first, by enumerating all prefixes."""
    counts: dict[tuple[int, ...], int] = {}
    for row in rows:
        for pages in range(1, len(row) // page_size + 1):
            prefix = tuple(row[: pages * page_size])
            counts[prefix] = counts.get(prefix, 0) + 1
    maximal = [
        prefix
        for prefix, count in counts.items()
        if count >= 2
        and not any(
            len(other) == len(prefix) + page_size and other[: len(prefix)] == prefix and n == count
            for other, n in counts.items()
        )
    ]
    maximal.sort(key=lambda p: (-(counts[p] - 1) * len(p), -len(p), p))
    return [SharedPrefix(len(p), counts[p], p[:32]) for p in maximal]


def test_prefix_stats_hand_example() -> None:
    rows = [
        [1, 2, 3, 4, 5, 6, 7, 8, 9],  # A: pages P1 P2, tail 1
        [1, 2, 3, 4, 5, 6, 7, 8, 10, 11],  # B: pages P1 P2, tail 2
        [1, 2, 3, 4, 5, 6, 7, 8],  # C: pages P1 P2, ends on a page boundary
        [1, 2, 3, 4, 20, 21],  # D: page P1, tail 2
        [30, 31, 32],  # E: no full page
        [1, 2, 3, 4, 5, 6, 7, 8],  # F: equal to C
    ]
    stats = ideal_prefix_stats(rows, page_size=4)
    # prompt = 9 + 10 + 8 + 6 + 3 + 8 = 44.
    # Best (sorted) order C F A B D E: C computes 8; F may reuse only P1 (its last token is
    # recomputed) so computes 4; A reuses P1 P2 and computes 1; B computes 2; D reuses P1 and
    # computes 2; E computes 3. unique = 8 + 4 + 1 + 2 + 2 + 3 = 20, reusable = 44 - 20 = 24.
    # Formula: tails 1 + 2 + 0 + 2 + 3 + 0 = 8, pages 4 * (max(0, 1) + max(2, 1)) = 12.
    assert stats == PrefixStats(
        page_size=4,
        rows=6,
        prompt_tokens=44,
        reusable_tokens=24,
        unique_tokens=20,
        predicted_prefill_saving=24 / 44,
        # P1 P2 is in A B C F: saves 3 * 8 = 24; P1 alone is in 5 rows: saves 4 * 4 = 16.
        top_shared_prefixes=(
            SharedPrefix(8, 4, (1, 2, 3, 4, 5, 6, 7, 8)),
            SharedPrefix(4, 5, (1, 2, 3, 4)),
        ),
    )
    stats.check_invariants()
    # In input order A B C D E F, C and F recompute P2 although A cached it: 20 tokens reused
    # (B 8, C 4, D 4, F 4), fewer than the ideal 24.
    assert naive_reusable(rows, 4) == 20
    assert naive_reusable(sorted(rows), 4) == 24


def test_prefix_stats_to_dict() -> None:
    stats = ideal_prefix_stats([[1, 2, 3], [1, 2, 4]], page_size=2)
    assert stats.to_dict() == {
        "page_size": 2,
        "rows": 2,
        "prompt_tokens": 6,
        "reusable_tokens": 2,
        "unique_tokens": 4,
        "predicted_prefill_saving": 2 / 6,
        "top_shared_prefixes": [{"num_tokens": 2, "num_rows": 2, "preview_token_ids": [1, 2]}],
    }


def test_no_rows_and_no_tokens() -> None:
    assert ideal_prefix_stats([], page_size=16) == PrefixStats(16, 0, 0, 0, 0, 0.0, ())
    assert ideal_prefix_stats([[], []], page_size=16) == PrefixStats(16, 2, 0, 0, 0, 0.0, ())


def test_identical_rows_on_a_page_boundary_recompute_their_last_page() -> None:
    # Two rows of exactly two pages: the second reuses page 1 and recomputes page 2.
    stats = ideal_prefix_stats([[1, 2, 3, 4], [1, 2, 3, 4]], page_size=2)
    assert (stats.reusable_tokens, stats.unique_tokens) == (2, 6)


def test_shared_prefix_must_be_maximal() -> None:
    # Both rows share two pages; the one-page prefix is not maximal (same two rows).
    rows = [[1, 1, 1, 1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 1, 1, 1, 1, 3]]
    stats = ideal_prefix_stats(rows, page_size=4)
    assert stats.top_shared_prefixes == (SharedPrefix(8, 2, (1, 1, 1, 1, 1, 1, 1, 1)),)


def test_top_shared_prefixes_ties_go_to_the_smaller_tokens_whatever_the_order() -> None:
    rows = [[9, 9, 9, 9, 1], [9, 9, 9, 9, 2], [5, 5, 5, 5, 1], [5, 5, 5, 5, 2]]
    for ordered in (rows, rows[::-1]):
        stats = ideal_prefix_stats(ordered, page_size=4, top=1)
        assert stats.top_shared_prefixes == (SharedPrefix(4, 2, (5, 5, 5, 5)),)
    assert ideal_prefix_stats(rows, page_size=4, top=0).top_shared_prefixes == ()


def test_preview_holds_the_first_32_tokens() -> None:
    shared = list(range(100, 148))  # three 16-token pages
    stats = ideal_prefix_stats([[*shared, 1], [*shared, 2]], page_size=16)
    assert stats.top_shared_prefixes == (SharedPrefix(48, 2, tuple(range(100, 132))),)


def test_builder_rejects_bad_arguments_and_tokens() -> None:
    with pytest.raises(ConfigError, match=r"^page_size must be >= 1, got 0$"):
        PrefixStatsBuilder(0)
    with pytest.raises(ConfigError, match=r"^top must be >= 0, got -1$"):
        PrefixStatsBuilder(4, top=-1)
    builder = PrefixStatsBuilder(4)
    builder.add([1, 2])
    message = r"^row 1: token ids must be integers in \[0, 4294967295\]$"
    with pytest.raises(InputError, match=message):
        builder.add([3, -(2**31) - 1])  # below the content ids (-2**31..-1)
    with pytest.raises(InputError, match=message):
        builder.add([2**32])
    assert builder.result().rows == 1  # a rejected row is not counted


def test_builder_is_streaming_and_reusable() -> None:
    builder = PrefixStatsBuilder(2)
    builder.add([1, 2, 3])
    assert builder.result().reusable_tokens == 0
    builder.add([1, 2, 4])
    assert builder.result().reusable_tokens == 2
    builder.check_invariants()


prefix_pool = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=4)


@st.composite
def rows_with_shared_prefixes(draw: st.DrawFn) -> list[list[int]]:
    """Rows built as a shared stem plus a short tail, over a tiny alphabet: lots of sharing."""
    stems = draw(prefix_pool)
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from(stems), st.lists(st.integers(0, 3), max_size=6)),
            max_size=16,
        )
    )
    return [stem[: draw(st.integers(0, len(stem)))] + tail for stem, tail in rows]


@settings(max_examples=300, deadline=None)
@given(rows=rows_with_shared_prefixes(), page_size=st.integers(1, 5), data=st.data())
def test_builder_matches_brute_force(
    rows: list[list[int]], page_size: int, data: st.DataObject
) -> None:
    builder = PrefixStatsBuilder(page_size, top=100)
    builder.add_all(rows)
    builder.check_invariants()
    stats = builder.result()
    stats.check_invariants()
    assert stats.rows == len(rows)
    assert stats.prompt_tokens == sum(len(row) for row in rows)
    # The ideal is the sorted order, and no order reuses more.
    assert stats.reusable_tokens == naive_reusable(sorted(rows), page_size)
    shuffled = data.draw(st.permutations(rows))
    assert stats.reusable_tokens >= naive_reusable(shuffled, page_size)
    if all(len(row) % page_size for row in rows):
        # No row ends on a page boundary: every order reuses the same.
        assert stats.reusable_tokens == naive_reusable(shuffled, page_size)
    assert list(stats.top_shared_prefixes) == naive_shared_prefixes(rows, page_size)[:100]
    # The statistics do not depend on the order rows are added in.
    assert ideal_prefix_stats(shuffled, page_size=page_size, top=100) == stats
