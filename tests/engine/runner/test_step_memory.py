"""The memory plan's worst decode step against a real one, measured on CPU with torch's
profiler (the CUDA path reads the allocator's peak counter the same way)."""

from __future__ import annotations

import random

import pytest
import torch

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner.memory_budget import (
    measure_peak,
    profile_activation_peak,
    profile_step_peaks,
    worst_decode_chunks,
)

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
    config = EngineConfig(
        num_pages=SEQS * 12 + 1,
        max_num_seqs=SEQS,
        max_model_len=CONTEXT,
        enable_prefix_cache=False,
    )
    core = EngineCore(loaded, config, invariance_probe=False)
    rng = random.Random(3)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for i in range(SEQS):  # each decodes once at position CONTEXT - 2, every context 3 blocks
        prompt = [rng.randrange(3, 300) for _ in range(CONTEXT - 2)]
        assert core.add_request(GenerationRequest(i, prompt, params)) == []
    while core.stats().decode_tokens < SEQS:  # the prefills, each sampling a first token
        core.step()
    measured = measure_peak(torch.device("cpu"), core.step)
    assert core.num_unfinished == 0 and core.stats().decode_tokens == 2 * SEQS
    assert measured <= decode <= 3 * measured, (measured, decode)
