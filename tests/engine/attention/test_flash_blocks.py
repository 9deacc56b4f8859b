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

from astrai_batch.engine.attention import flash_probe
from astrai_batch.engine.attention.flash_block_plan import (
    ROW_MULTIPLE,
    FlashBlockBatch,
    FlashRules,
    plan_flash_calls,
)
from astrai_batch.engine.attention.flash_blocks import flash_block_attention, flash_kernel
from astrai_batch.engine.attention.flash_probe import invariant_tails
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.step_arrays import StepArrays

PAGE = 16
KV_HEADS, GROUP, DIM = 2, 3, 16
SCALE = DIM**-0.5
LENGTHS = (5, 40, 300, 511, 512, 513, 700, 1100)  # sequence lengths of the pool's sequences
# the tails MKL gives here (`flash_probe`); the crowd test uses what the probe finds
MEASURED_TAILS = (64, 128, 192, 384, 448, 512)


class Pool:
    """KV for every sequence in LENGTHS, in shuffled pages; a fixed query per position."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        pages = [-(-n // PAGE) for n in LENGTHS]
        order = list(range(1, sum(pages) + 1))  # page 0: the padding page
        rng.shuffle(order)
        self.tables, used = [], 0
        for count in pages:
            self.tables.append(np.array(order[used : used + count], dtype=np.int64))
            used += count
        slots = (sum(pages) + 1) * PAGE
        self.keys = torch.randn(slots, KV_HEADS, DIM, generator=generator)
        self.values = torch.randn(slots, KV_HEADS, DIM, generator=generator)
        self.queries = [torch.randn(n, KV_HEADS * GROUP, DIM, generator=generator) for n in LENGTHS]

    def slots(self, seq: int, positions: range) -> np.ndarray:
        table = self.tables[seq]
        return np.array([table[p // PAGE] * PAGE + p % PAGE for p in positions], dtype=np.int64)


def run_step(
    pool: Pool, chunks: list[tuple[int, int, int]], tails: tuple[int, ...] = MEASURED_TAILS
) -> dict[tuple[int, int], torch.Tensor]:
    """chunks: (sequence, start, length) -> {(sequence, position): output row}."""
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
    calls = plan_flash_calls(step, PAGE, FlashRules(GROUP, tails), torch.float32, staging)
    batch = FlashBlockBatch(
        [pool.keys], [pool.values], PAGE, staging.array(step.write_slots), 0, calls, PageGatherer()
    )
    out = flash_block_attention(torch.cat(queries), pool.keys, pool.values, batch, SCALE)
    got, row = {}, 0
    for seq, start, n in chunks:
        for p in range(start, start + n):
            got[(seq, p)] = out[row]
            row += 1
    return got


def random_steps(rng: random.Random) -> list[list[tuple[int, int, int]]]:
    """Every position of every sequence, cut into chunks and decodes, mixed into steps."""
    pieces = []
    for seq, n in enumerate(LENGTHS):
        start = 0
        while start < n:
            length = 1 if rng.random() < 0.3 else rng.randint(1, n - start)
            length = min(length, n - start)
            pieces.append((seq, start, length))
            start += length
    rng.shuffle(pieces)
    # a step holds at most one chunk per sequence, as the scheduler makes them
    steps: list[list[tuple[int, int, int]]] = []
    for piece in pieces:
        home = [s for s in steps if all(c[0] != piece[0] for c in s) and rng.random() < 0.7]
        if not home:
            steps.append([])
            home = [steps[-1]]
        home[0].append(piece)
    return steps


@pytest.fixture(scope="module")
def tails_here() -> tuple[int, ...]:
    tails = invariant_tails(DIM, KV_HEADS, torch.float32)
    if tails is None:
        pytest.skip(
            "torch's CPU flash kernel is not row-invariant on this CPU: the engine "
            "keeps the block attention here (tested in test_batch_invariance)"
        )
    return tails


def test_outputs_match_a_float64_brute_force() -> None:
    pool = Pool(seed=1)
    chunks = [(0, 0, 5), (2, 100, 200), (4, 511, 1), (5, 0, 513), (6, 699, 1), (7, 1000, 100)]
    got = run_step(pool, chunks)
    for (seq, p), row in got.items():
        q = pool.queries[seq][p].double().view(KV_HEADS, GROUP, DIM)
        slots = pool.slots(seq, range(p + 1))
        k = pool.keys[slots].double().transpose(0, 1)  # [Hkv, p + 1, D]
        v = pool.values[slots].double().transpose(0, 1)
        weights = torch.softmax(q @ k.transpose(1, 2) * SCALE, dim=-1)
        want = (weights @ v).reshape(KV_HEADS * GROUP, DIM)
        torch.testing.assert_close(row.double(), want, atol=2e-6, rtol=1e-5)


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


def test_the_plan_pads_rows_and_keys_and_classes_decodes_by_blocks() -> None:
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
    calls = plan_flash_calls(step, PAGE, rules, torch.float32, HostStaging("cpu"))
    # the chunk (300 keys: a 384-key tail), then decodes by key length: contexts 5 (a 64-key
    # tail), 511, 513 (a full block and 64), 601 (512 + 128) and 1100 (1024 + 128)
    assert [(c.elements, c.tokens, c.keys) for c in calls] == [
        (1, 297, 384),
        (1, 1, 64),
        (1, 1, 512),
        (1, 1, 576),
        (1, 1, 640),
        (1, 1, 1152),
    ]
    assert all(c.query_rows % ROW_MULTIPLE == 0 for c in calls)
    assert calls[0].query_rows == 892 and calls[1].query_rows == 4
    chunk = calls[0]
    assert chunk.page_tables.shape == (1, 384 // PAGE)
    # row (member g, token t) sees keys 0 .. 3 + t; the padding row sees every key
    visible = (chunk.mask[0, 0] == 0).sum(dim=1).tolist()
    assert visible == [4 + t for t in range(297)] * GROUP + [384]
    assert [c.rows.tolist() for c in calls[1:]] == [[starts[i]] for i in (1, 2, 3, 5, 4)]
    seen = [(c.mask[:, 0, 0] == 0).sum(dim=1).tolist() for c in calls[1:]]
    assert seen == [[5], [511], [513], [601], [1100]]
    # tables cover the keys, padded with page 0 past the sequence's own pages
    assert calls[5].page_tables.shape == (1, 1152 // PAGE)
    assert calls[5].page_tables[0, 69:].tolist() == [0] * 3


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
