"""The step buffers: kept between steps, they must equal a batch built from scratch.

A seeded random run of the real scheduler and cache manager (no model): sequences arrive,
share prefixes (so pages switch to their cached twins), finish at random, and a small pool
forces preemptions. After every step the persistent buffers' batch must equal both a fresh
`StepBuffers`' batch and a plain-Python reference built from the page tables themselves.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from engine_reference import make_sequence

from astrai_batch.cache import make_layout
from astrai_batch.engine.attention.cascade import partition_decodes, partition_rows
from astrai_batch.engine.attention.step_arrays import StepArrays, to_device
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.runner.step_buffers import StepBuffers
from astrai_batch.engine.scheduler import Scheduler, chunk_for
from astrai_batch.engine.sequences.sequence import Sequence

PAGE = 4
FIELDS = (
    "token_ids",
    "positions",
    "write_slots",
    "logit_rows",
    "token_start",
    "num_tokens",
    "context_start",
    "page_tables",
    "decodes",
)


def reference(chunks: list[ScheduledChunk], page: int) -> dict[str, np.ndarray]:
    """The batch as the runner built it before step buffers: per chunk, in Python."""
    token_ids, positions, slots, logit_rows, starts, tables = [], [], [], [], [], []
    for chunk in chunks:
        n = len(chunk.token_ids)
        end = chunk.start + n
        starts.append(len(token_ids))
        if chunk.wants_logits:
            logit_rows.append(len(token_ids) + n - 1)
        token_ids.extend(chunk.token_ids)
        for p in range(chunk.start, end):
            positions.append(p)
            slots.append(chunk.pages[p // page] * page + p % page)
        tables.append(list(chunk.pages[: -(-end // page)]))
    width = max(len(t) for t in tables)
    counts = [len(c.token_ids) for c in chunks]
    return {
        "token_ids": np.array(token_ids),
        "positions": np.array(positions),
        "write_slots": np.array(slots),
        "logit_rows": np.array(logit_rows, dtype=np.int64),
        "token_start": np.array(starts),
        "num_tokens": np.array(counts),
        "context_start": np.array([c.start for c in chunks]),
        "page_tables": np.array([t + [0] * (width - len(t)) for t in tables]),
        "decodes": np.array([i for i, n in enumerate(counts) if n == 1], dtype=np.int64),
    }


def assert_same(arrays: StepArrays, expected: dict[str, np.ndarray]) -> None:
    for name in FIELDS:
        got = getattr(arrays, name)
        assert got.dtype == np.int64, name
        assert np.array_equal(got, expected[name]), name


def make_seq(seq_id: int, prompt: list[int], max_tokens: int) -> Sequence:
    return make_sequence(seq_id, prompt, page_size=PAGE, max_tokens=max_tokens)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("seed", range(6))
def test_kept_buffers_equal_buffers_built_from_scratch(seed: int, layout: str) -> None:
    rng = random.Random(seed)
    # paged: 14 pages force preemptions; contiguous: 4 seats of 56 tokens (the longest row)
    cache = make_layout(
        layout,
        num_pages=14 if layout == "paged" else 56,
        page_size=PAGE,
        max_model_len=56,
        max_num_seqs=8,
        enable_prefix_cache=True,
    )
    config = EngineConfig(page_size=PAGE, max_num_seqs=8, max_num_batched_tokens=24)
    scheduler = Scheduler(config, cache)
    kept = StepBuffers(PAGE)
    prefixes = [[rng.randrange(3, 50) for _ in range(rng.randint(4, 14))] for _ in range(3)]
    next_id = 0
    chunks_seen = 0
    decode_steps = 0
    for _ in range(150):
        while rng.random() < 0.5 and len(scheduler.waiting) < 6:
            head = rng.choice(prefixes) if rng.random() < 0.7 else []
            prompt = head + [rng.randrange(3, 50) for _ in range(rng.randint(1, 9))]
            scheduler.add(make_seq(next_id, prompt, rng.randint(1, 30)))
            next_id += 1
        plan = scheduler.schedule()
        if not plan.work:
            continue
        chunks = [chunk_for(item, cache) for item in plan.work]
        arrays = kept.build(chunks)
        kept.check_invariants()
        expected = reference(chunks, PAGE)
        assert_same(arrays, expected)
        assert_same(StepBuffers(PAGE).build(chunks), expected)
        chunks_seen += len(chunks)
        decode_steps += all(len(c.token_ids) == 1 for c in chunks)
        sampled = [item.seq for item in plan.work if item.completes_known_tokens]
        scheduler.after_step(plan.work)
        for seq in sampled:
            seq.tokens.append(rng.randrange(3, 50))
            generated = seq.num_tokens - seq.prompt_len
            if generated >= seq.params.max_tokens or rng.random() < 0.03:
                scheduler.finish(seq)
        cache.check_invariants()
    if layout == "paged":
        assert scheduler.preemptions > 0  # the run covered preemption
    assert decode_steps > 0
    assert kept.rows_written < chunks_seen  # unchanged rows were kept, not rewritten


def test_chunks_without_a_key_are_written_for_their_step_only() -> None:
    buffers = StepBuffers(PAGE)
    chunks = [
        ScheduledChunk([5, 6, 7], 0, [9], True),
        ScheduledChunk([8], 6, [3, 4], True, seq_key="a", pages_version=1),
    ]
    arrays = buffers.build(chunks)
    assert_same(arrays, reference(chunks, PAGE))
    assert arrays.write_slots.tolist() == [36, 37, 38, 18]
    assert arrays.logit_rows.tolist() == [2, 3]
    buffers.check_invariants()
    # the keyed row stays; changing its pages without a new version is not noticed by
    # design (the version is the contract), a new version rewrites it
    again = buffers.build([ScheduledChunk([1], 7, [3, 5], True, seq_key="a", pages_version=2)])
    assert again.write_slots.tolist() == [23]
    assert buffers.rows_written == 3


def test_a_chunk_past_its_pages_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        StepBuffers(PAGE).build([ScheduledChunk([1, 2], 3, [7], True)])
    assert str(raised.value) == "chunk ends at token 5 but its 1 pages hold 4"
    with pytest.raises(ValueError) as raised:
        StepBuffers(PAGE).build([ScheduledChunk([], 0, [7], True)])
    assert str(raised.value) == "a scheduled chunk has no tokens"


@pytest.mark.parametrize("seed", range(60))
def test_partition_rows_equals_partition_decodes(seed: int) -> None:
    rng = random.Random(seed)
    shared = [[rng.randrange(100) for _ in range(6)] for _ in range(3)]
    tables, lengths = [], []
    for _ in range(rng.randint(1, 24)):
        base = list(rng.choice(shared)[: rng.randint(0, 6)]) if rng.random() < 0.8 else []
        table = base + [rng.randrange(100, 200) for _ in range(rng.randint(1, 4))]
        tables.append(table)
        lengths.append(rng.randint((len(table) - 1) * PAGE + 1, len(table) * PAGE))
    width = max(len(t) for t in tables)
    padded = np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int64)
    got = partition_rows(padded, np.array(lengths), PAGE)
    want = partition_decodes(tables, lengths, PAGE)
    assert got.groups == want.groups
    assert got.rest == want.rest


def test_to_device_on_cpu_shares_the_array() -> None:
    array = np.arange(4, dtype=np.int64)
    tensor = to_device(array, torch.device("cpu"))
    array[0] = 7
    assert tensor.tolist() == [7, 1, 2, 3]
