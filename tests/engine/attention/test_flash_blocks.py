"""Invariant attention in torch's CPU flash kernel (`flash_blocks`), against a float64 brute
force and against itself: a query's bits alone and inside random crowds.

Sequences get random page tables over one pool and fixed random queries per position. A
query is computed alone (its whole sequence as one prefill chunk), then in random steps
where its sequence is cut into chunks at random points, some tokens decoded one at a time,
beside other sequences' chunks and decodes, with contexts across the 512- and 1024-key block
boundaries. Every output row must be `torch.equal` to the alone one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from attention_kit import (
    DIM,
    GROUP,
    KV_HEADS,
    LENGTHS,
    PAGE,
    SCALE,
    SINKS,
    Pool,
    brute_force,
    random_steps,
)

from astrai_batch.engine.attention import flash_probe
from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention, flash_kernel
from astrai_batch.engine.attention.flash_probe import invariant_tails
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.step_arrays import StepArrays

# the tails MKL gives here (`flash_probe`); the crowd test uses what the probe finds
MEASURED_TAILS = (64, 128, 192, 384, 448, 512)


def run_step(
    pool: Pool,
    chunks: list[tuple[int, int, int]],
    tails: tuple[int, ...] = MEASURED_TAILS,
    seen: list | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> dict[tuple[int, int], torch.Tensor]:
    """chunks: (sequence, start, length) -> {(sequence, position): output row}; with a
    sliding `window` and per-head `sinks`, as a windowed layer's plan computes them."""
    width = max(len(pool.tables[s]) for s, _, _ in chunks)
    tables = np.zeros((len(chunks), width), dtype=np.int64)
    starts, queries = [], []
    row = 0
    for i, (seq, start, n) in enumerate(chunks):
        tables[i, : len(pool.tables[seq])] = pool.tables[seq]
        starts.append(row)
        queries.append(pool.queries[seq][start : start + n])
        row += n
    num_tokens = np.array([n for _, _, n in chunks], dtype=np.int64)
    step = StepArrays(
        token_ids=np.zeros(row, dtype=np.int64),
        positions=np.zeros(row, dtype=np.int64),
        write_slots=np.zeros(row, dtype=np.int64),
        logit_rows=np.zeros(0, dtype=np.int64),
        token_start=np.array(starts, dtype=np.int64),
        num_tokens=num_tokens,
        context_start=np.array([s for _, s, _ in chunks], dtype=np.int64),
        page_tables=tables,
        decodes=np.flatnonzero(num_tokens == 1),
        longest_context=max(s + n for _, s, n in chunks),
    )
    staging = HostStaging("cpu")
    rules = FlashRules(GROUP, tails)
    calls, merge = plan_flash_step(step, PAGE, rules, torch.float32, staging, window)
    assert_each_block_once(step, calls, merge, window)
    if seen is not None:
        seen.extend(calls)
    batch = FlashBlockBatch(
        [pool.keys],
        [pool.values],
        PAGE,
        staging.array(step.write_slots),
        0,
        calls,
        merge,
        PageGatherer(),
        window,
    )
    out = flash_block_attention(torch.cat(queries), pool.keys, pool.values, batch, SCALE, sinks)
    got, row = {}, 0
    for seq, start, n in chunks:
        for p in range(start, start + n):
            got[(seq, p)] = out[row]
            row += 1
    return got


def assert_each_block_once(step: StepArrays, calls, merge, window: int | None = None) -> None:
    """Every query within one block gets its output from exactly one call; every longer
    query's every block (and nothing past its last, nor wholly before its window) from
    exactly one element."""
    positions = np.concatenate(
        [s + np.arange(n) for s, n in zip(step.context_start, step.num_tokens, strict=True)]
    )
    rows = np.concatenate(
        [t + np.arange(n) for t, n in zip(step.token_start, step.num_tokens, strict=True)]
    )
    direct = sorted(x for c in calls if not c.merged for x in c.slots.tolist())
    assert direct == sorted(rows[positions < 512].tolist())
    merged = sorted(x for c in calls if c.merged for x in c.slots.tolist())
    want = []
    if merge is not None:
        at = dict(zip(rows.tolist(), positions.tolist(), strict=True))
        for i, row in enumerate(merge.rows.tolist()):
            first = 0 if window is None else max(at[row] - window + 1, 0) // 512
            want += [i * merge.blocks + b for b in range(first, at[row] // 512 + 1)]
        assert sorted(merge.rows.tolist()) == sorted(rows[positions >= 512].tolist())
    assert merged == sorted(want)


@pytest.fixture(scope="module")
def tails_here() -> tuple[int, ...]:
    tails = invariant_tails(DIM, KV_HEADS, torch.float32)
    if tails is None:
        pytest.skip(
            "torch's CPU flash kernel is not row-invariant on this CPU: the engine "
            "keeps the block attention here (tested in test_batch_invariance)"
        )
    return tails


CHUNKS = [(0, 0, 5), (2, 100, 200), (4, 511, 1), (5, 0, 513), (6, 699, 1), (7, 1000, 100)]


@pytest.mark.parametrize(
    ("window", "sinks"),
    [(None, None), (None, SINKS), (40, None), (300, SINKS), (600, SINKS)],
    ids=["full", "sinks", "window-40", "window-300-sinks", "window-600-sinks"],
)
def test_outputs_match_a_float64_brute_force(window, sinks) -> None:
    pool = Pool(seed=1)
    got = run_step(pool, CHUNKS, window=window, sinks=sinks)
    for (seq, p), row in got.items():
        want = brute_force(pool, seq, p, window, sinks)
        torch.testing.assert_close(row.double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_windowed_queries_with_sinks_have_the_same_bits_alone_and_in_crowds(tails_here, seed):
    """Windows of 100 (inside a block) and 700 (across two): alone vs random crowds."""
    window = (100, 700, 300)[seed]
    pool = Pool(seed=seed)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails_here, window=window, sinks=SINKS))
    rng = random.Random(seed)
    for step in random_steps(rng):
        got = run_step(pool, step, tails_here, window=window, sinks=SINKS)
        for key, row in got.items():
            assert torch.equal(row, alone[key]), f"seed {seed}: {key} differs in step {step}"


@pytest.mark.parametrize("seed", range(6))
def test_a_query_has_the_same_bits_alone_and_in_random_crowds(tails_here, seed) -> None:
    pool = Pool(seed=seed)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails_here))
    rng = random.Random(seed)
    for step in random_steps(rng):
        for key, row in run_step(pool, step, tails_here).items():
            assert torch.equal(row, alone[key]), f"seed {seed}: {key} differs in step {step}"


def test_the_plan_splits_long_queries_into_blocks_and_shares_whole_prefix_blocks() -> None:
    pool = Pool(seed=2)
    chunks = [(2, 3, 297), (0, 4, 1), (3, 510, 1), (5, 512, 1), (7, 1099, 1), (6, 600, 1)]
    starts = np.cumsum([0] + [n for _, _, n in chunks[:-1]])
    tables = np.zeros((len(chunks), 80), dtype=np.int64)
    for i, (seq, _, _) in enumerate(chunks):
        tables[i, : len(pool.tables[seq])] = pool.tables[seq]
    num_tokens = np.array([n for _, _, n in chunks])
    step = StepArrays(
        *(np.zeros(1, dtype=np.int64),) * 4,
        token_start=starts,
        num_tokens=num_tokens,
        context_start=np.array([s for _, s, _ in chunks]),
        page_tables=tables,
        decodes=np.flatnonzero(num_tokens == 1),
        longest_context=1100,
    )
    rules = FlashRules(GROUP, MEASURED_TAILS)
    calls, merge = plan_flash_step(step, PAGE, rules, torch.float32, HostStaging("cpu"))
    # one block's queries take the kernel's output: the chunk (300 keys: a 384-key tail),
    # decodes at contexts 5 (64) and 511 (512); longer ones go block by block to the merge:
    # 513 and 601 (sharing block 0's pages: one element), 1100 (blocks 0 and 1, its tail)
    assert [(c.keys, c.tokens, c.merged, c.elements) for c in calls] == [
        (384, 297, False, 1),
        (512, 2, True, 1),  # block 0 of 513 and 601, read once
        (64, 1, False, 1),
        (64, 1, True, 1),  # context 513's last block: 1 key
        (128, 1, True, 2),  # 1100's and 601's last blocks: 76 and 89 keys
        (512, 1, False, 1),
        (512, 1, True, 2),  # blocks 0 and 1 of 1100
    ]
    assert [c.query_rows for c in calls] == [892, 8, 4, 4, 4, 4, 4]
    assert calls[0].slots.tolist() == list(range(297))
    assert [calls[i].slots.tolist() for i in (2, 5)] == [[297], [298]]
    # merge slots: query i's block b is i * 3 + b (queries 299, 300, 301 of the batch)
    assert merge.rows.tolist() == [299, 300, 301] and merge.blocks == 3
    assert [calls[i].slots.tolist() for i in (3, 4, 1, 6)] == [[1], [5, 7], [0, 6], [3, 4]]
    shared = calls[1]
    assert shared.token_index.tolist() == [299, 301]
    assert shared.page_tables[0].tolist() == pool.tables[4][:32].tolist()
    assert (shared.mask == 0).all()  # a whole shared block ends before either query
    # row (member g, token t) of the chunk sees keys 0 .. 3 + t; the padding row every key
    visible = (calls[0].mask[0, 0] == 0).sum(dim=1).tolist()
    assert visible == [4 + t for t in range(297)] * GROUP + [384]
    # the tail of 1100 reads keys 1024..1151: its pages from the 65th, padded with page 0
    tail = calls[4].page_tables[0].tolist()
    assert tail == pool.tables[7][64:69].tolist() + [0] * 3
    assert (calls[4].mask[:, 0, 0] == 0).sum(dim=1).tolist() == [76, 89]


def test_decodes_sharing_whole_blocks_have_their_bits_alone(tails_here) -> None:
    pool = Pool(seed=7)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails_here))
    rng = random.Random(7)
    calls: list = []
    for _ in range(12):  # every sequence decodes at once, within its last 200 positions
        step = [(seq, n - 1 - rng.randrange(min(n, 200)), 1) for seq, n in enumerate(LENGTHS)]
        for key, row in run_step(pool, step, tails_here, calls).items():
            assert torch.equal(row, alone[key]), f"{key} differs in step {step}"
    shared = [c for c in calls if c.merged and c.tokens > 1]
    assert len(shared) >= 12  # every step shares block 0 of 1100 and 1500, some block 1


def test_the_probe_refuses_a_kernel_whose_short_calls_differ(monkeypatch) -> None:
    real = flash_kernel()

    def uneven(q, k, v, **kwargs):
        out, lse = real(q, k, v, **kwargs)
        if q.shape[2] < 16:  # a small call's rows come out otherwise
            out = out + 1e-6
        return out, lse

    monkeypatch.setattr(flash_probe, "flash_kernel", lambda: uneven)
    assert invariant_tails(DIM, KV_HEADS, torch.float32) is None


def test_the_probe_refuses_a_kernel_that_reads_masked_keys(monkeypatch) -> None:
    real = flash_kernel()

    def leaky(q, k, v, attn_mask=None, **kwargs):  # masked keys weigh a little
        return real(q, k, v, attn_mask=attn_mask.clamp(min=-5.0), **kwargs)

    monkeypatch.setattr(flash_probe, "flash_kernel", lambda: leaky)
    assert invariant_tails(DIM, KV_HEADS, torch.float32) is None


def test_the_probe_keeps_only_tails_with_the_full_blocks_bits(monkeypatch) -> None:
    real = flash_kernel()

    def chunked(q, k, v, **kwargs):  # a last block of 448 keys summed otherwise
        out, lse = real(q, k, v, **kwargs)
        if k.shape[2] % 512 == 448:
            out = out * (1 + 1e-6)
        return out, lse

    monkeypatch.setattr(flash_probe, "flash_kernel", lambda: chunked)
    tails = invariant_tails(DIM, KV_HEADS, torch.float32)
    assert tails is not None and 448 not in tails and 512 in tails
