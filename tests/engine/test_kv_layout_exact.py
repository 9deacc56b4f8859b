"""Both KV layouts give transformers' greedy tokens, and the same tokens as each other."""

from __future__ import annotations

import pytest
from engine_reference import hf_greedy, mixed_prompts

from astrai_batch.cache import SeatTable
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model

MAX_NEW = 16


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def _tokens(loaded, prompts, config):
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    return [list(r.token_ids) for r in results], stats


@pytest.mark.parametrize(("shared", "step_tokens"), [(False, 1024), (True, 1024), (False, 24)])
def test_contiguous_and_paged_match_transformers(loaded, tiny_model_dir, shared, step_tokens):
    """24 tokens a step chunks prefills, so chunks read their seat's earlier keys in place."""
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=7, shared=shared, count=12)
    common = dict(
        page_size=8,
        num_pages=160,
        max_model_len=192,
        max_num_seqs=8,
        max_num_batched_tokens=step_tokens,
    )
    contiguous, contiguous_stats = _tokens(
        loaded, prompts, EngineConfig(kv_layout="contiguous", **common)
    )
    paged, paged_stats = _tokens(loaded, prompts, EngineConfig(kv_layout="paged", **common))
    assert contiguous == paged
    assert contiguous == hf_greedy(tiny_model_dir, prompts, MAX_NEW)
    assert contiguous_stats.cache.hit_tokens == 0
    assert contiguous_stats.cache.lookups == len(prompts)
    assert contiguous_stats.preemptions == 0
    assert contiguous_stats.prefill_tokens == sum(len(p) for p in prompts)
    if shared:
        assert paged_stats.cache.hit_tokens > 0


def test_contiguous_admits_only_as_many_as_seats(loaded, tiny_model_dir):
    """160 pages of 8 tokens, seats of 192 tokens (24 pages): 6 seats, fewer than max_num_seqs."""
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=8, count=10)
    config = EngineConfig(
        kv_layout="contiguous", page_size=8, num_pages=160, max_model_len=192, max_num_seqs=8
    )
    core = EngineCore(loaded, config)
    assert isinstance(core.cache, SeatTable)
    assert core.cache.num_seats == 6
    params = SamplingParams(max_tokens=MAX_NEW)
    for index, prompt in enumerate(prompts):
        assert core.add_request(GenerationRequest(index, prompt, params)) == []
    results = []
    while core.num_unfinished:
        results += core.step()
        core.check_invariants()
        assert len(core.scheduler.running) <= 6
    assert core.scheduler.peak_running == 6
    assert len(results) == len(prompts)
    by_id = sorted(results, key=lambda r: r.request_id)
    assert [list(r.token_ids) for r in by_id] == hf_greedy(tiny_model_dir, prompts, MAX_NEW)
    assert core.cache.stats().pages_in_use == 0
    assert core.cache.stats().peak_pages_in_use == 6 * 24
