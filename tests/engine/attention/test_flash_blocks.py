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
    step_for,
)

from astrai_batch.engine.attention import flash_probe
from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention, flash_kernel
from astrai_batch.engine.attention.flash_probe import invariant_tails, probe_flash_block
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
    block: int = 512,
) -> dict[tuple[int, int], torch.Tensor]:
    """chunks: (sequence, start, length) -> {(sequence, position): output row}; with a
    sliding `window` and per-head `sinks`, as a windowed layer's plan computes them, in
    key blocks of `block`."""
    step, queries = step_for(pool, chunks)
    staging = HostStaging("cpu")
    rules = FlashRules(GROUP, tails, block)
    calls, merge = plan_flash_step(step, PAGE, rules, torch.float32, staging, window)
    assert_each_block_once(step, calls, merge, window, block)
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
    out = flash_block_attention(queries, pool.keys, pool.values, batch, SCALE, sinks)
    got, row = {}, 0
    for seq, start, n in chunks:
        for p in range(start, start + n):
            got[(seq, p)] = out[row]
            row += 1
    return got


def assert_each_block_once(
    step: StepArrays, calls, merge, window: int | None = None, block: int = 512
) -> None:
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
    assert direct == sorted(rows[positions < block].tolist())
    merged = sorted(x for c in calls if c.merged for x in c.slots.tolist())
    want = []
    if merge is not None:
        at = dict(zip(rows.tolist(), positions.tolist(), strict=True))
        for i, row in enumerate(merge.rows.tolist()):
            first = 0 if window is None else max(at[row] - window + 1, 0) // block
            want += [i * merge.blocks + b for b in range(first, at[row] // block + 1)]
        assert sorted(merge.rows.tolist()) == sorted(rows[positions >= block].tolist())
    assert merged == sorted(want)


def probed_tails(block: int = 512) -> tuple[int, ...]:
    tails = invariant_tails(DIM, KV_HEADS, torch.float32, block)
    if tails is None:
        pytest.skip(
            f"torch's CPU flash kernel is not row-invariant in {block}-key blocks on this CPU: "
            "the engine keeps another block or the block attention here"
        )
    return tails


CHUNKS = [(0, 0, 5), (2, 100, 200), (4, 511, 1), (5, 0, 513), (6, 699, 1), (7, 1000, 100)]


@pytest.mark.parametrize(
    ("window", "sinks", "block"),
    [
        (None, None, 512),
        (None, SINKS, 512),
        (40, None, 512),
        (300, SINKS, 512),
        (600, SINKS, 512),
        (None, None, 64),
        (300, SINKS, 64),
    ],
    ids=[
        "full",
        "sinks",
        "window-40",
        "window-300-sinks",
        "window-600-sinks",
        "block64",
        "block64-window-300-sinks",
    ],
)
def test_outputs_match_a_float64_brute_force(window, sinks, block) -> None:
    pool = Pool(seed=1)
    tails = tuple(t for t in MEASURED_TAILS if t <= block)  # a shorter block's tails: <= it
    got = run_step(pool, CHUNKS, tails, window=window, sinks=sinks, block=block)
    for (seq, p), row in got.items():
        want = brute_force(pool, seq, p, window, sinks)
        torch.testing.assert_close(row.double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(("seed", "block"), [(0, 512), (1, 512), (2, 64)])
def test_windowed_queries_with_sinks_have_the_same_bits_alone_and_in_crowds(seed, block):
    """Windows of 100 (inside a 512-key block) and 700 (across two), 300 across 64-key
    blocks: alone vs random crowds."""
    tails = probed_tails(block)
    window = (100, 700, 300)[seed]
    pool = Pool(seed=seed)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails, window=window, sinks=SINKS, block=block))
    rng = random.Random(seed)
    for step in random_steps(rng):
        got = run_step(pool, step, tails, window=window, sinks=SINKS, block=block)
        for key, row in got.items():
            assert torch.equal(row, alone[key]), f"seed {seed}: {key} differs in step {step}"


@pytest.mark.parametrize(
    ("seed", "block"), [(0, 512), (1, 512), (2, 512), (3, 64), (4, 128), (5, 256)]
)
def test_a_query_has_the_same_bits_alone_and_in_random_crowds(seed, block) -> None:
    tails = probed_tails(block)
    pool = Pool(seed=seed)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails, block=block))
    rng = random.Random(seed)
    for step in random_steps(rng):
        for key, row in run_step(pool, step, tails, block=block).items():
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


@pytest.mark.parametrize("block", [512, 64])
def test_decodes_sharing_whole_blocks_have_their_bits_alone(block) -> None:
    tails = probed_tails(block)
    pool = Pool(seed=7)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails, block=block))
    rng = random.Random(7)
    calls: list = []
    for _ in range(12):  # every sequence decodes at once, within its last 200 positions
        step = [(seq, n - 1 - rng.randrange(min(n, 200)), 1) for seq, n in enumerate(LENGTHS)]
        for key, row in run_step(pool, step, tails, calls, block=block).items():
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


def decode_step(tables: np.ndarray, positions: list[int]) -> StepArrays:
    """One decode per row of `tables`, at `positions`."""
    n = len(positions)
    return StepArrays(
        *(np.zeros(n, dtype=np.int64),) * 4,
        token_start=np.arange(n),
        num_tokens=np.ones(n, dtype=np.int64),
        context_start=np.array(positions),
        page_tables=tables,
        decodes=np.arange(n),
        longest_context=max(positions) + 1,
    )


def test_short_shared_prefixes_are_read_once_in_short_blocks() -> None:
    """Eight decodes at 320..348 sharing a 288-token prefix (18 pages): in 512-key blocks
    each reads its own 384 keys; in 64-key blocks blocks 0-3 (256 prefix keys) are one
    element each with all eight queries, and each decode reads only blocks 4 and 5."""
    rng = np.random.default_rng(3)
    tables = np.zeros((8, 24), dtype=np.int64)
    tables[:, :22] = rng.permutation(np.arange(1, 200))[: 8 * 22].reshape(8, 22)
    tables[:, :18] = tables[0, :18]
    positions = [320 + 4 * i for i in range(8)]
    step = decode_step(tables, positions)
    staging = HostStaging("cpu")

    def plan(block):
        tails = tuple(t for t in MEASURED_TAILS if t <= block)
        rules = FlashRules(GROUP, tails, block)
        return plan_flash_step(step, PAGE, rules, torch.float32, staging)

    calls, merge = plan(512)
    assert merge is None and [(c.keys, c.elements, c.tokens) for c in calls] == [(384, 8, 1)]
    calls, merge = plan(64)
    assert merge.blocks == 6 and merge.rows.tolist() == list(range(8))
    shared = [c for c in calls if c.tokens > 1]
    assert [(c.keys, c.elements, c.tokens, c.query_rows) for c in shared] == [(64, 4, 8, 24)]
    assert shared[0].page_tables.tolist() == tables[0, :16].reshape(4, 4).tolist()
    assert (shared[0].mask == 0).all()
    own = sorted((c.keys, c.elements) for c in calls if c.tokens == 1)
    assert own == [(64, 16)]  # block 4 (pages 16-19, two of them own) and the tail
    assert sum(c.elements * c.keys for c in calls) == 4 * 64 + 8 * 128  # 3,072 at 512
    assert_each_block_once(step, calls, merge, block=64)
    # sharing off (the cascade off: the memory plan's worst decode step): each decode reads
    # its own blocks, as when no pages are shared
    rules = FlashRules(GROUP, tuple(t for t in MEASURED_TAILS if t <= 64), 64)
    calls, merge = plan_flash_step(step, PAGE, rules, torch.float32, staging, share=False)
    assert all(c.tokens == 1 for c in calls)
    assert sum(c.elements * c.keys for c in calls) == 8 * 6 * 64
    assert_each_block_once(step, calls, merge, block=64)


def test_below_float32_the_probe_keeps_the_kernels_own_block() -> None:
    """A bfloat16 block's output is rounded before the fold: only 512-key blocks, whose
    contexts under 512 keys are one call, as transformers' attention over the whole prompt."""
    assert flash_probe.block_candidates(torch.float32) == (128, 64, 256, 512)
    assert flash_probe.block_candidates(torch.bfloat16) == (512,)
    assert flash_probe.block_candidates(torch.float16) == (512,)
    found = probe_flash_block(DIM, KV_HEADS, torch.bfloat16, PAGE)
    assert found is None or found[0] == 512


# (sequence, first pages it takes from sequence 2): prefixes of 288 tokens (across the
# 256-key boundary), 64 (exactly one 64-key block), 128, 144 and 48 (under one 64-key block)
SHORT_PREFIXES = {3: 18, 4: 4, 5: 8, 6: 9, 7: 3}


@pytest.mark.parametrize("block", [64, 128])
def test_short_shared_prefixes_have_their_bits_alone_in_crowds(block) -> None:
    """Prefixes around the short blocks' boundaries, shared by decodes (read once) and by
    chunked prefills: every row's bits alone."""
    tails = probed_tails(block)
    pool = Pool(seed=11)
    for seq, pages in SHORT_PREFIXES.items():
        pool.tables[seq][:pages] = pool.tables[2][:pages]
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], tails, block=block))
    rng = random.Random(11)
    calls: list = []
    steps = [
        [(seq, min(n, 300) - 1 - rng.randrange(min(n, 40)), 1) for seq, n in enumerate(LENGTHS)]
        for _ in range(4)
    ] + random_steps(rng)
    for step in steps:
        for key, row in run_step(pool, step, tails, calls, block=block).items():
            assert torch.equal(row, alone[key]), f"{key} differs in step {step}"
    assert any(c.merged and c.tokens > 1 and c.keys == block for c in calls[:20])


def test_the_probe_prefers_128_keys_then_falls_back_to_64(monkeypatch) -> None:
    real = flash_kernel()
    uneven = {128}

    def short_calls_uneven(q, k, v, **kwargs):  # small calls over these keys come out otherwise
        out, lse = real(q, k, v, **kwargs)
        if k.shape[2] in uneven and q.shape[2] < 16:
            out = out + 1e-6
        return out, lse

    monkeypatch.setattr(flash_probe, "flash_kernel", lambda: short_calls_uneven)
    if invariant_tails(DIM, KV_HEADS, torch.float32, 64) is None:
        pytest.skip("this CPU's kernel keeps no 64-key block: nothing to fall back to")
    assert probe_flash_block(DIM, KV_HEADS, torch.float32, PAGE) == (
        64,
        invariant_tails(DIM, KV_HEADS, torch.float32, 64),
    )
    uneven.clear()
    found = probe_flash_block(DIM, KV_HEADS, torch.float32, PAGE)
    if invariant_tails(DIM, KV_HEADS, torch.float32, 128) is None:
        pytest.skip("this CPU's kernel keeps no 128-key block")
    assert found == (128, invariant_tails(DIM, KV_HEADS, torch.float32, 128))
    assert found[1][-1] == 128


@pytest.mark.parametrize("page", [16, 128, 24])
def test_the_probe_takes_the_first_candidate_of_whole_pages_that_passes(page) -> None:
    """The block is a function of the shapes, dtype, pages and machine alone: the first of
    the candidates (preferred first) that holds whole pages and passes."""
    want = next(
        (
            (b, t)
            for b in flash_probe.block_candidates(torch.float32)
            if b % page == 0 and (t := invariant_tails(DIM, KV_HEADS, torch.float32, b))
        ),
        None,
    )
    assert probe_flash_block(DIM, KV_HEADS, torch.float32, page) == want
    if page == 24:
        assert want is None
