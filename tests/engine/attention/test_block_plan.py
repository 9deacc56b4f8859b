"""The batch-invariant attention plan against a brute-force reading of what it must cover.

For random decode rows (some sharing prefix pages, so the cascade makes runs) and a prefill
chunk, every (query row, key block up to the row's own) pair must be computed exactly once, by
a run or by a private unit, reading that block's pages of the row's own table, with exactly
the keys after the query masked; units sorted by block, rows in step order within a block.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from astrai_batch.engine.attention.block_plan import (
    DecodeRows,
    QuerySpan,
    block_tokens_for,
    plan_blocks,
)
from astrai_batch.engine.attention.host_staging import HostStaging

PAGE = 16


def random_decodes(rng: random.Random, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions and zero-padded page tables; rows of a group share their leading pages."""
    positions = np.array([rng.randrange(0, 300) for _ in range(count)], dtype=np.int64)
    needed = positions // PAGE + 1
    tables = np.zeros((count, int(needed.max())), dtype=np.int64)
    free = iter(rng.sample(range(1, 10_000), 10_000 - 1))
    leaders: list[int] = []
    for row in range(count):
        own = [next(free) for _ in range(needed[row])]
        if leaders and rng.random() < 0.6:
            leader = rng.choice(leaders)
            shared = min(rng.randrange(0, 12), needed[row] - 1, needed[leader] - 1)
            own[:shared] = tables[leader, :shared].tolist()
        else:
            leaders.append(row)
        tables[row, : needed[row]] = own
    return positions, tables


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("use_cascade", [True, False])
def test_every_query_block_pair_is_computed_once_with_its_own_pages(
    seed: int, use_cascade: bool
) -> None:
    rng = random.Random(seed)
    block = block_tokens_for(PAGE)
    per_block = block // PAGE
    prefill_start, prefill_length = 70, 90  # rows 0..89: a chunk over positions 70..159
    prefill_pages = [20_000 + i for i in range(-(-(prefill_start + prefill_length) // PAGE))]
    positions, tables = random_decodes(rng, 40)
    rows = np.arange(prefill_length, prefill_length + len(positions), dtype=np.int64)
    spans = [QuerySpan(0, prefill_start, prefill_length, prefill_pages)]
    runs, units = plan_blocks(
        spans, PAGE, use_cascade, HostStaging("cpu"), DecodeRows(rows, positions, tables)
    )

    # the brute-force truth: each query row's position and table
    query_position = {r: prefill_start + r for r in range(prefill_length)}
    query_table = {r: prefill_pages for r in range(prefill_length)}
    for row, position, table in zip(rows.tolist(), positions.tolist(), tables, strict=True):
        query_position[row] = position
        query_table[row] = table.tolist()

    def block_pages(row: int, b: int) -> list[int]:
        pages = list(query_table[row][b * per_block : (b + 1) * per_block])
        return pages + [0] * (per_block - len(pages))

    def masked(row: int, b: int) -> list[bool]:
        return [b * block + j > query_position[row] for j in range(block)]

    covered: dict[tuple[int, int], str] = {}
    for run_index, run in enumerate(runs):
        table = run.page_table[0].tolist()
        for i, row in enumerate(run.rows.tolist()):
            for b in range(run.num_blocks):
                # None: the run masks nothing (a cascade run's blocks precede every row's own)
                run_masked = [False] * block
                if run.key_masked is not None:
                    run_masked = run.key_masked[i, b, 0, 0].tolist()
                if b * block > query_position[row]:
                    # a prefill run's rows may reach past their own block: fully masked there
                    assert all(run_masked)
                    continue
                assert (row, b) not in covered, f"row {row} block {b} computed twice"
                covered[row, b] = f"run {run_index}"
                assert table[b * per_block : (b + 1) * per_block] == block_pages(row, b)
                assert run_masked == masked(row, b)
    unit_rows = units.rows.tolist()
    unit_masks = units.masked_keys(block)
    assert unit_masks.shape == (len(unit_rows), 1, 1, block)
    starts = units.block_starts
    assert starts[0] == 0 and starts[-1] == len(unit_rows)
    for b in range(len(starts) - 1):
        members = unit_rows[starts[b] : starts[b + 1]]
        assert members == sorted(members)  # step order within a block
        for offset, row in enumerate(members):
            u = starts[b] + offset
            assert (row, b) not in covered, f"row {row} block {b} computed twice"
            assert all(c < b for r, c in covered if r == row and covered[r, c] != "unit")
            covered[row, b] = "unit"
            assert units.page_tables[u].tolist() == block_pages(row, b)
            assert unit_masks[u, 0, 0].tolist() == masked(row, b)
    expected = {(row, b) for row, p in query_position.items() for b in range(p // block + 1)}
    assert set(covered) == expected
    decode_rows = set(rows.tolist())
    assert {row for row, _ in covered if covered[row, _] == "unit"} <= decode_rows
    if use_cascade:
        assert any(set(run.rows.tolist()) <= decode_rows for run in runs)  # a cascade run
    else:
        assert all(not set(run.rows.tolist()) & decode_rows for run in runs)


def test_a_step_without_decodes_has_no_units() -> None:
    spans = [QuerySpan(0, 0, 5, [3])]
    runs, units = plan_blocks(spans, PAGE, True, HostStaging("cpu"), DecodeRows.from_spans([]))
    assert len(runs) == 1 and units.rows.numel() == 0 and units.block_starts == [0]
    assert units.masked_keys(block_tokens_for(PAGE)).shape == (0, 1, 1, 64)
