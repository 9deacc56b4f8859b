"""Scoring on the real SmolLM2-135M: each continuation's log-likelihood within 1e-4 of a
transformers forward over (context + continuation), `is_greedy` exact, the few-shot context
computed once (slow: real weights)."""

from __future__ import annotations

import pytest
from engine.tasks.test_scoring_exact import assert_scores, run, with_greedy_choice

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.model.loader import load_model

pytestmark = pytest.mark.slow

SHOTS = "Q: What is 2 + 2?\nA: 4\nQ: What colour is the sky?\nA: blue\n"
QUESTIONS = ["Q: How many legs does a cat have?\nA:", "Q: What do bees make?\nA:"]
CHOICES = [" four", " two", " honey", " milk"]


def test_smollm2_scores_match_transformers():
    loaded = load_model("smollm2-135m")
    tokenizer = loaded.tokenizer
    rows = []
    for question in QUESTIONS:
        context = tuple(tokenizer(SHOTS + question, add_special_tokens=False)["input_ids"])
        conts = tuple(
            tuple(tokenizer(choice, add_special_tokens=False)["input_ids"]) for choice in CHOICES
        )
        rows.append((context, conts))
    rows[0] = with_greedy_choice(loaded.source, *rows[0])
    results, _ = run(loaded, rows, EngineConfig(page_size=16, num_pages=64))
    assert_scores(loaded.source, rows, results)
    assert results[0].scores[0].is_greedy
    assert results[1].cached_tokens > 0  # the second row found the few-shot pages
