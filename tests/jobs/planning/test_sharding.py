"""Prefix-aware sharding: whole groups per shard, balance by work, splits at subtree
boundaries, and the hit rates `plan --workers` predicts (checked against brute force)."""

from __future__ import annotations

import itertools
import random

import pytest
from jobs.jobkit import run_cli, shared_prefix_prompts, write_jsonl

from astrai_batch.errors import ConfigError
from astrai_batch.jobs.planning.prefix_order import plan_window
from astrai_batch.jobs.planning.shard_prediction import predict_shards
from astrai_batch.jobs.planning.sharding import (
    KeyedRow,
    assign_shards,
    estimate_work,
    group_key,
    input_order_blocks,
    summarize_rows,
)

PAGE = 4


def rows_of(prompts: list[list[int]], max_new: int = 0) -> list[KeyedRow]:
    return [KeyedRow(i, tuple(p), max_new) for i, p in enumerate(prompts)]


def shards_of(rows: list[KeyedRow], workers: int) -> list[list[int]]:
    plan = assign_shards(summarize_rows(rows, PAGE), workers, PAGE)
    out: list[list[int]] = [[] for _ in range(workers)]
    for row in rows:
        out[plan.route(group_key(row.index, row.token_ids, PAGE), row.token_ids)].append(row.index)
    return out


def brute_force_work(rows: list[KeyedRow]) -> int:
    """Prefill when rows run in sorted order, each reusing the whole pages it shares with
    any row before it (the last prompt token always computed), plus tokens to generate."""
    work, seen = 0, []
    for row in sorted(rows, key=lambda r: r.token_ids):
        best = 0
        for other in seen:
            pages = 0
            while (pages + 1) * PAGE <= min(len(other), len(row.token_ids)) and other[
                : (pages + 1) * PAGE
            ] == row.token_ids[: (pages + 1) * PAGE]:
                pages += 1
            best = max(best, pages * PAGE)
        best = min(best, ((len(row.token_ids) - 1) // PAGE) * PAGE)
        work += len(row.token_ids) - best + row.max_new_tokens
        seen.append(row.token_ids)
    return work


@pytest.mark.parametrize("seed", range(5))
def test_work_estimate_equals_brute_force(seed: int) -> None:
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(3) for _ in range(rng.randrange(1, 14))] for _ in range(30)]
    rows = rows_of(prompts, max_new=rng.randrange(5))
    assert estimate_work(rows, PAGE) == brute_force_work(rows)


def test_groups_stay_whole_and_shards_balance_by_work_not_rows() -> None:
    # Group a: 6 short rows; group b: 2 long identical rows with more work than a and c.
    a = [[1, 1, 1, 1, i, 9] for i in range(6)]
    b = [[2, 2, 2, 2, *range(40)]] * 2
    c = [[3, 3, 3, 3, i] for i in range(3)]
    rows = rows_of(a + b + c, max_new=2)
    shards = shards_of(rows, 2)
    assert sorted(map(sorted, shards)) == [[0, 1, 2, 3, 4, 5, 8, 9, 10], [6, 7]]


def test_a_group_larger_than_a_share_splits_at_its_first_branch() -> None:
    # One group (shared first page) that branches at page 2 into three subtrees.
    base = [5, 5, 5, 5]
    prompts = [base + [k] * 4 + [i, i] for k in (1, 2, 3) for i in range(4)]
    prompts.append([*base, 1, 1])  # ends above the branch point: goes with the first subtree
    rows = rows_of(prompts, max_new=1)
    shards = shards_of(rows, 3)
    subtree = {i: (prompts[i][4] if len(prompts[i]) > 6 else 1) for i in range(len(prompts))}
    for shard in shards:
        assert len({subtree[i] for i in shard}) == 1  # each subtree whole, one per shard
    assert sorted(len(s) for s in shards) == [4, 4, 5]


def test_a_group_a_little_over_a_share_stays_whole() -> None:
    # Four groups that branch after their first page; group 0 has one row more (1.25 shares).
    prompts = [[g] * 4 + [i] * 4 for g in range(4) for i in range(4)] + [[0] * 4 + [9] * 4]
    rows = rows_of(prompts)
    shards = shards_of(rows, 4)
    assert sorted({prompts[i][0] for i in shard} for shard in map(tuple, shards)) == [
        {0},
        {1},
        {2},
        {3},
    ]


def test_identical_rows_are_never_split_and_plans_are_deterministic() -> None:
    rows = rows_of([[7] * 8] * 5 + [[8] * 8], max_new=3)
    assert sorted(map(sorted, shards_of(rows, 2))) == [[0, 1, 2, 3, 4], [5]]
    assert [sorted(s) for s in shards_of(list(reversed(rows)), 2)] == shards_of(rows, 2)
    plan = assign_shards(summarize_rows(rows, PAGE), 4, PAGE)
    plan.check_invariants()
    assert sorted(plan.group_numbers.values()) == [0, 1]
    with pytest.raises(ConfigError, match="workers must be >= 1, got 0"):
        assign_shards([], 0, PAGE)


def test_input_order_blocks_cover_every_row_once() -> None:
    blocks = input_order_blocks(10, 3)
    assert [list(b) for b in blocks] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert list(itertools.chain(*input_order_blocks(2, 3))) == [0, 1]


def test_prediction_keeps_the_one_worker_hit_rate_and_input_order_loses_it() -> None:
    prompts = [[g] * 8 + [i] for i in range(6) for g in (1, 2, 3)]  # groups interleaved
    prediction = predict_shards(rows_of(prompts), 3, PAGE)
    # Each group of 6 rows of 9 tokens reuses its 8-token prefix in 5 rows: 3*5*8 / (18*9).
    assert prediction.one_worker_hit_rate == prediction.prefix_aware_hit_rate == 120 / 162
    # Input-order blocks of 6 rows hold 2 rows of each group: one reuse per group per block.
    assert prediction.input_order_hit_rate == 9 * 8 / 162


def test_plan_prints_the_prediction(tiny_llama_dir, tmp_path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in shared_prefix_prompts(24)])

    result = run_cli("plan", source, "--model", tiny_llama_dir, "--workers", "2")

    assert result.exit_code == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("predicted hit rate"))
    assert "with prefix-aware shards" in line and "with blocks in input order" in line
    bad = run_cli("plan", source, "--model", tiny_llama_dir, "--workers", "0")
    assert bad.exit_code == 1
    assert bad.stderr == "Error: workers must be >= 1, got 0\n"


@pytest.mark.parametrize("seed", range(8))
def test_group_numbers_and_groups_are_the_local_plans_with_adapters(seed: int) -> None:
    # A Ray run numbered prefix groups without the rows' adapters: rows of two adapters with
    # one first page were one group, and the prefix_group column differed from a local run's.
    rng = random.Random(seed)
    stems = [[rng.randrange(6) for _ in range(PAGE)] for _ in range(3)]
    prompts = [
        [*rng.choice(stems), *(rng.randrange(6) for _ in range(rng.randrange(0, 7)))][
            : rng.randrange(2, 12)
        ]
        for _ in range(rng.randrange(8, 30))
    ]
    adapters = [rng.choice((None, "a", "b", "long-name")) for _ in prompts]
    rows = [
        KeyedRow(i, tuple(p), 2, adapter)
        for i, (p, adapter) in enumerate(zip(prompts, adapters, strict=True))
    ]

    plan = assign_shards(summarize_rows(rows, PAGE), rng.randint(1, 3), PAGE)
    local = plan_window(prompts, page_size=PAGE, adapters=adapters)

    keys = [group_key(r.index, r.token_ids, PAGE, r.adapter) for r in rows]
    assert [plan.group_numbers[key] for key in keys] == list(local.prefix_group)
