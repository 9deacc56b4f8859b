"""prompt_logprobs (vLLM) and top_logprobs (OpenAI) equal a transformers forward over the
same text: values within 1e-5, ranks and top-N ids exact; with and without prefix-cache hits,
with chunked prefill and with preemption."""

from __future__ import annotations

import pytest
import torch
from engine_reference import _reference_model, mixed_prompts

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model

N = 5


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def hf_logprobs(model_dir, tokens):
    model = _reference_model(str(model_dir))
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def close(a: float, b: float) -> bool:
    """Within 1e-5, relative for values below -1: float32 sums in another order differ in
    the last bits, and an unlikely token's logprob (-10 and below) has larger ones."""
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def assert_position(entry, row, token):
    assert entry.token_id == token
    assert close(entry.logprob, float(row[token]))
    assert entry.rank == int((row > row[token]).sum()) + 1
    values, ids = torch.topk(row, N)
    assert [t for t, _ in entry.top] == ids.tolist()
    assert all(close(v, float(w)) for (_, v), w in zip(entry.top, values, strict=True))


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(page_size=8, num_pages=256),
        EngineConfig(page_size=8, num_pages=256, enable_prefix_cache=False),
        EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=16),
        EngineConfig(page_size=8, num_pages=17, max_num_seqs=16),
    ],
    ids=["cache", "no-cache", "chunked", "preempting"],
)
def test_prompt_and_top_logprobs_match_transformers(loaded, tiny_model_dir, config):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=9, shared=True, count=10)
    params = SamplingParams(max_tokens=6, top_logprobs=N, prompt_logprobs=N)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    # the same prompts once more without prompt logprobs: these hit the cache
    plain = SamplingParams(max_tokens=6, top_logprobs=N)
    requests += [GenerationRequest(100 + i, p, plain) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    if config.num_pages == 17:
        assert stats.preemptions > 0
    if config.enable_prefix_cache:
        assert stats.cache.hit_tokens > 0
    for result in results:
        prompt = prompts[result.request_id % 100]
        tokens = list(prompt) + list(result.token_ids)
        reference = hf_logprobs(tiny_model_dir, tokens)
        if result.request_id < 100:
            assert result.prompt_logprobs[0] is None
            assert len(result.prompt_logprobs) == len(prompt)
            for p in range(1, len(prompt)):
                assert_position(result.prompt_logprobs[p], reference[p - 1], prompt[p])
        else:
            assert result.prompt_logprobs is None
        assert len(result.top_logprobs) == len(result.token_ids)
        for k, entry in enumerate(result.top_logprobs):
            position = len(prompt) - 1 + k
            assert_position(entry, reference[position], result.token_ids[k])
            assert entry.rank == 1  # greedy
