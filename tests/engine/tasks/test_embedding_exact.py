"""Embedding requests: pooled last hidden states equal transformers' (cosine > 0.99999),
bitwise the same alone and in a batch, with chunked prefill and prefix-cache hits;
normalization and truncation exact."""

from __future__ import annotations

import pytest
import torch
from engine_reference import _reference_model, mixed_prompts

from astrai_batch.engine import EngineConfig, GenerationRequest, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.tasks.embedding_types import EmbedRequest


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def hf_pooled(model_dir, tokens, pooling):
    model = _reference_model(str(model_dir))
    with torch.inference_mode():
        hidden = model.model(torch.tensor([tokens])).last_hidden_state[0].float()
    return {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling]


def embed(loaded, prompts, request, config):
    requests = [GenerationRequest(i, p, embed=request) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    return [torch.tensor(r.embedding) for r in results], stats


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_pooled_hidden_states_match_transformers(loaded, tiny_model_dir, pooling):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=4, shared=True, count=8)
    request = EmbedRequest(pooling=pooling, normalize=False)
    config = EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=48)
    vectors, stats = embed(loaded, prompts, request, config)
    for prompt, vector in zip(prompts, vectors, strict=True):
        want = hf_pooled(tiny_model_dir, prompt, pooling)
        assert torch.nn.functional.cosine_similarity(vector, want, dim=0) > 0.99999
    assert stats.decode_tokens == 0
    if pooling == "last":  # only the last position is needed: shared prefixes hit the cache
        assert stats.cache.hit_tokens > 0
    else:
        assert stats.cache.hit_tokens == 0
    # alone, unchunked: the same bits (invariant numerics)
    for i in (0, 5):
        alone, _ = embed(loaded, [prompts[i]], request, EngineConfig(page_size=8, num_pages=256))
        assert torch.equal(alone[0], vectors[i])


def test_normalize_and_truncate_exactly(loaded):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=6, count=4)
    config = EngineConfig(page_size=8, num_pages=256)
    raw, _ = embed(loaded, prompts, EmbedRequest(normalize=False), config)
    unit, _ = embed(loaded, prompts, EmbedRequest(normalize=True), config)
    short, _ = embed(loaded, prompts, EmbedRequest(normalize=True, dimensions=16), config)
    for r, u, s in zip(raw, unit, short, strict=True):
        assert torch.equal(u, torch.nn.functional.normalize(r, dim=0))
        assert torch.equal(s, torch.nn.functional.normalize(r[:16], dim=0))
        assert s.shape == (16,)
