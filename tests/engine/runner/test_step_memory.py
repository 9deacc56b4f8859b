"""The memory plan's worst decode step against a real one, measured on CPU with torch's
profiler (the CUDA path reads the allocator's peak counter the same way)."""

from __future__ import annotations

import pytest
import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner.memory_budget import (
    measure_peak,
    profile_activation_peak,
    profile_step_peaks,
    worst_decode_chunks,
)
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk

SEQS, CONTEXT, PAGE = 6, 192, 16


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


def pool_args(loaded) -> dict:
    return dict(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=PAGE,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_the_worst_decode_is_every_sequence_at_the_last_position() -> None:
    pages, chunks = worst_decode_chunks(SEQS, CONTEXT, PAGE)
    assert pages == 12 and len(chunks) == SEQS
    assert {(tuple(c.token_ids), c.start, tuple(c.pages), c.wants_logits) for c in chunks} == {
        ((0,), CONTEXT - 1, tuple(range(12)), True)
    }


def test_cpu_peaks_are_measured() -> None:
    def allocate() -> None:
        held = torch.zeros(1000, 1000)  # 4 MB, then 8 MB more while it is held
        more = torch.zeros(2000, 1000)
        del held, more

    assert measure_peak(torch.device("cpu"), allocate) == 12_000_000


def test_planned_decode_peak_covers_a_real_decode_step(loaded) -> None:
    prefill, decode = profile_step_peaks(
        loaded.model,
        pool_args(loaded),
        max_num_batched_tokens=1024,
        max_num_seqs=SEQS,
        max_model_len=CONTEXT,
    )
    assert prefill > 0 and decode > 0
    planned = profile_activation_peak(
        loaded.model,
        pool_args(loaded),
        max_num_batched_tokens=1024,
        max_num_seqs=SEQS,
        max_model_len=CONTEXT,
        graphs=True,
    )
    assert planned == max(prefill, decode) + decode
    # A real decode step of the same size on its own runner, each sequence's pages spread
    # over the pool as evictions and preemptions leave them (seq i: pages i, i + SEQS, ...),
    # so every context is gathered, as in the worst case the plan profiles.
    pages = -(-CONTEXT // PAGE)
    pool = KVPool(num_pages=SEQS * pages, **pool_args(loaded))
    runner = ModelRunner(loaded.model, pool)
    chunks = [
        ScheduledChunk([7], CONTEXT - 1, [i + SEQS * k for k in range(pages)], True, i, 0)
        for i in range(SEQS)
    ]
    measured = measure_peak(torch.device("cpu"), lambda: runner.forward(chunks))
    assert measured <= decode <= 3 * measured, (measured, decode)
