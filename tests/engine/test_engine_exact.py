"""Greedy output of the engine equals transformers `generate`, token for token."""

from __future__ import annotations

import pytest
from engine_reference import hf_greedy, mixed_prompts

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model

MAX_NEW = 24


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def run_engine(loaded, prompts, config, max_new=MAX_NEW):
    params = SamplingParams(max_tokens=max_new)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    return generate_sync(loaded, requests, config)


def assert_matches_hf(model_dir, prompts, results, max_new=MAX_NEW):
    expected = hf_greedy(model_dir, prompts, max_new)
    got = [list(r.token_ids) for r in results]
    assert len(got) == len(expected)
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {i} (len {len(prompts[i])}) differs"


def test_prefix_cache_off(loaded, tiny_model_dir):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=1)
    config = EngineConfig(page_size=16, num_pages=256, enable_prefix_cache=False)
    results, stats = run_engine(loaded, prompts, config)
    assert_matches_hf(tiny_model_dir, prompts, results)
    assert stats.cache.hit_tokens == 0
    assert all(r.cached_tokens == 0 for r in results)
    assert stats.prefill_tokens == sum(len(p) for p in prompts)


def test_prefix_cache_heavy_sharing(loaded, tiny_model_dir):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=2, shared=True, count=20)
    config = EngineConfig(page_size=8, num_pages=256)
    results, stats = run_engine(loaded, prompts, config)
    assert_matches_hf(tiny_model_dir, prompts, results)
    assert stats.cache.hit_tokens > 0
    assert sum(r.cached_tokens for r in results) == stats.cache.hit_tokens
    assert stats.prefill_tokens == sum(len(p) for p in prompts) - stats.cache.hit_tokens


def test_small_pool_evicts_and_preempts(loaded, tiny_model_dir):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=3, shared=True, count=16)
    # 24 pages of 8 tokens: a few sequences at a time, so decode growth forces preemption.
    config = EngineConfig(page_size=8, num_pages=24, max_num_seqs=16)
    results, stats = run_engine(loaded, prompts, config)
    assert_matches_hf(tiny_model_dir, prompts, results)
    assert stats.preemptions > 0
    assert stats.cache.evicted_pages > 0
    # One lookup per request at its first admission: refused admissions and returns after
    # preemption add nothing, so the counters agree with the rows' own figures.
    assert stats.cache.lookups == len(prompts)
    assert stats.cache.hit_tokens == sum(r.cached_tokens for r in results)
    assert stats.cache.hit_tokens + stats.cache.missed_tokens == sum(len(p) for p in prompts)


def test_small_token_budget_chunks_prefill(loaded, tiny_model_dir):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=4)
    config = EngineConfig(page_size=16, num_pages=256, max_num_batched_tokens=20)
    results, stats = run_engine(loaded, prompts, config)
    assert_matches_hf(tiny_model_dir, prompts, results)
    longest = max(len(p) for p in prompts)
    assert stats.steps >= longest // 20  # the 150-token prompt alone needs 8 chunks
