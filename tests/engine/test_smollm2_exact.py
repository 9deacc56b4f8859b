"""Greedy output on the real SmolLM2-135M equals transformers `generate` (slow: real weights)."""

from __future__ import annotations

import pytest
import torch
from engine_reference import bf16_near_tie, hf_greedy, hf_greedy_with_margins

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


def test_smollm2_bfloat16_greedy_matches_transformers_bfloat16():
    """Invariant numerics in bfloat16 (the start-up probe passes) against transformers in
    bfloat16: token for token, except after a near-tie of transformers' own top two logits
    (another valid summation order may break it the other way: `test_architectures_exact`)."""
    loaded = load_model("smollm2-135m", dtype="bfloat16")
    tokenizer = loaded.tokenizer
    prompts = []
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    config = EngineConfig(page_size=16, num_pages=64, max_num_batched_tokens=48)
    requests = [
        GenerationRequest(i, p, SamplingParams(max_tokens=20)) for i, p in enumerate(prompts)
    ]
    results, _ = generate_sync(loaded, requests, config)
    expected = hf_greedy_with_margins(loaded.source, prompts, 20, torch.bfloat16)
    exact = 0
    for i, (result, (want, top2)) in enumerate(zip(results, expected, strict=True)):
        got = list(result.token_ids)[: len(want)]
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        exact += first is None
        if first is not None:
            assert bf16_near_tie(*top2[first]), (i, first, top2[first])
    # how many near-ties flip depends on the CPU's bf16 kernels (1 of 5 on a Sapphire Rapids
    # Xeon, 2 of 5 on an AMD Zen 4 with AVX-512 BF16): each flip is checked above
    assert exact >= len(prompts) // 2
    assert "Paris" in results[0].text
