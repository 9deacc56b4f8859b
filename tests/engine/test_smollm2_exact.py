"""Greedy output on the real SmolLM2-135M equals transformers `generate` (slow: real weights)."""

from __future__ import annotations

import pytest
import torch
from engine_reference import hf_greedy

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model

pytestmark = pytest.mark.slow

SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What do bees make?",
    "How many legs does a spider have?",
    "Which planet is known as the red planet?",
]


def test_smollm2_greedy_matches_transformers():
    torch.manual_seed(0)
    loaded = load_model("smollm2-135m")
    tokenizer = loaded.tokenizer
    prompts = []
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    params = SamplingParams(max_tokens=20)
    # a small budget and pool: shared system-prompt pages, chunked prefill, and decode together
    config = EngineConfig(page_size=16, num_pages=64, max_num_batched_tokens=48)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    expected = hf_greedy(loaded.source, prompts, 20)
    assert [list(r.token_ids) for r in results] == expected
    assert stats.cache.hit_tokens > 0
    assert "Paris" in results[0].text
