"""Scoring requests: each continuation's log-likelihood given its context equals a
transformers forward over (context + continuation), is_greedy exactly, and the context is
computed once per request (its continuations fork from it), shared prefixes once per run."""

from __future__ import annotations

import random

import pytest
import torch
from engine_reference import _reference_model

from astrai_batch.engine import EngineConfig, GenerationRequest, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.tasks.scoring_types import ScoreRequest

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def hf_pair_score(model_dir, context, continuation):
    """lm-eval's rule: one forward over (context + continuation)[:-1], the continuation's
    log-softmax entries summed; greedy when every argmax equals the continuation token."""
    model = _reference_model(str(model_dir))
    tokens = list(context) + list(continuation)
    with torch.inference_mode():
        logits = model(torch.tensor([tokens[:-1]])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(context) - 1 :]
    target = torch.tensor(continuation)
    picked = logprobs[torch.arange(len(continuation)), target]
    greedy = bool((logprobs.argmax(dim=-1) == target).all())
    return float(picked.sum()), greedy


def workload(vocab_size: int, seed: int, *, rows: int = 6, choices: int = 4):
    """Rows of 4 continuations (1 to 9 tokens) over contexts sharing two few-shot prefixes
    (lengths off page boundaries), and one row whose first choice is the greedy path."""
    rng = random.Random(seed)
    shots = [[rng.randrange(3, vocab_size) for _ in range(rng.randint(30, 50))] for _ in range(2)]
    out = []
    for i in range(rows):
        context = shots[i % 2] + [rng.randrange(3, vocab_size) for _ in range(rng.randint(3, 20))]
        conts = [
            tuple(rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 9)))
            for _ in range(choices)
        ]
        out.append((tuple(context), tuple(conts)))
    return out


def with_greedy_choice(model_dir, context, conts):
    """Replaces the first continuation by the model's own greedy 3 tokens."""
    model = _reference_model(str(model_dir))
    tokens = list(context)
    with torch.inference_mode():
        for _ in range(3):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return context, (tuple(tokens[len(context) :]), *conts[1:])


def run(loaded, rows, config):
    requests = [
        GenerationRequest(i, context, score=ScoreRequest(conts))
        for i, (context, conts) in enumerate(rows)
    ]
    return generate_sync(loaded, requests, config)


def assert_scores(model_dir, rows, results):
    for (context, conts), result in zip(rows, results, strict=True):
        assert result.error is None, result.error
        assert len(result.scores) == len(conts)
        for cont, score in zip(conts, result.scores, strict=True):
            want, greedy = hf_pair_score(model_dir, context, cont)
            assert abs(score.logprob - want) < TOLERANCE, (score.logprob, want)
            assert score.is_greedy == greedy
            assert score.num_tokens == len(cont)


@pytest.mark.parametrize("page_size", [8, 16])
def test_scores_match_transformers_and_contexts_run_once(loaded, tiny_model_dir, page_size):
    rows = workload(loaded.model.config.vocab_size, seed=page_size)
    rows[0] = with_greedy_choice(tiny_model_dir, *rows[0])
    results, stats = run(loaded, rows, EngineConfig(page_size=page_size, num_pages=256))
    assert_scores(tiny_model_dir, rows, results)
    assert results[0].scores[0].is_greedy
    # computed: each context less what the prefix cache held when it was admitted, plus
    # each continuation's tokens but its last; nothing else
    branches = sum(len(c) - 1 for _, conts in rows for c in conts)
    contexts = sum(len(context) for context, _ in rows)
    cached = sum(r.cached_tokens for r in results)
    assert stats.prefill_tokens == contexts - cached + branches
    assert cached > 0  # later rows found their few-shot prefix's pages
    assert stats.preemptions == 0


def test_shared_prefix_is_computed_once_per_run(loaded, tiny_model_dir):
    """Rows whose contexts share one prefix of whole pages: every row after the first finds
    all of it in the cache, so the prefix is computed exactly once."""
    rng = random.Random(5)
    vocab = loaded.model.config.vocab_size
    shot = [rng.randrange(3, vocab) for _ in range(32)]  # 4 pages of 8
    rows = []
    for _ in range(5):
        context = tuple(shot + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))])
        rows.append((context, tuple((rng.randrange(3, vocab),) * 2 for _ in range(3))))
    results, stats = run(loaded, rows, EngineConfig(page_size=8, num_pages=256))
    assert_scores(tiny_model_dir, rows, results)
    assert [r.cached_tokens for r in results] == [0, 32, 32, 32, 32]
    tails = sum(len(context) - 32 for context, _ in rows)
    assert stats.prefill_tokens == 32 + tails + 5 * 3


def test_without_prefix_cache_branches_recompute_the_context(loaded, tiny_model_dir):
    rows = workload(loaded.model.config.vocab_size, seed=3, rows=3)
    config = EngineConfig(page_size=8, num_pages=256, enable_prefix_cache=False)
    results, stats = run(loaded, rows, config)
    assert_scores(tiny_model_dir, rows, results)
    expected = sum(
        len(context) + sum(len(context) + len(c) - 1 for c in conts if len(c) > 1)
        for context, conts in rows
    )
    assert stats.prefill_tokens == expected


def test_chunked_prefill_and_preemption_keep_the_scores(loaded, tiny_model_dir):
    rows = workload(loaded.model.config.vocab_size, seed=7, rows=8)
    config = EngineConfig(page_size=8, num_pages=12, max_num_batched_tokens=24, max_num_seqs=8)
    results, stats = run(loaded, rows, config)
    assert_scores(tiny_model_dir, rows, results)
    assert stats.preemptions > 0


def test_scores_are_bitwise_the_same_alone_and_in_a_batch(loaded):
    """The batch-invariance promise. On a machine where test_batch_invariance's
    test_alone_equals_in_crowd fails (one-token chunks differ in their last bits), this
    fails the same way (< 5e-6 here)."""
    rows = workload(loaded.model.config.vocab_size, seed=11, rows=6)
    config = EngineConfig(page_size=8, num_pages=256)
    together, _ = run(loaded, rows, config)
    for i, row in enumerate(rows):
        alone, _ = run(loaded, [row], config)
        assert alone[0].scores == together[i].scores


def test_scores_alone_and_in_a_batch_agree_within_1e_5(loaded):
    rows = workload(loaded.model.config.vocab_size, seed=11, rows=6)
    config = EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=8)
    together, _ = run(loaded, rows, config)
    for i, row in enumerate(rows):
        alone, _ = run(loaded, [row], config)
        for a, b in zip(alone[0].scores, together[i].scores, strict=True):
            assert a.is_greedy == b.is_greedy
            assert all(
                abs(x - y) < 1e-5 for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True)
            )


def test_a_request_over_the_model_length_fails_alone(loaded):
    context = tuple(range(3, 40))
    config = EngineConfig(page_size=8, num_pages=256, max_model_len=40)
    core = EngineCore(loaded, config)
    failed = core.add_request(
        GenerationRequest("x", context, score=ScoreRequest(((5,), (6, 7, 8, 9, 10))))
    )
    assert [r.error for r in failed] == [
        "context (37 tokens) + continuations[1] (5 tokens) - 1 = 41 exceeds the model context "
        "of 40 tokens"
    ]
    core.close()


def test_a_pair_one_token_over_the_model_length_is_scored(loaded, tiny_model_dir):
    """The model never sees a continuation's last token, so context + continuation may be
    max_model_len + 1 tokens: lm-eval's rolling windows are exactly that long."""
    rows = [(tuple(range(3, 40)), ((5, 6, 7, 8), (9,)))]  # 37 + 4 = 41 = 40 + 1
    config = EngineConfig(page_size=8, num_pages=256, max_model_len=40)
    results, _ = run(loaded, rows, config)
    assert_scores(tiny_model_dir, rows, results)
