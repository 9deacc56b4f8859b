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


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"temperature": 0.7, "seed": 3, "top_k": 40, "repetition_penalty": 1.3},
    ],
    ids=["greedy", "sampled-penalised"],
)
def test_constrained_rows_report_the_raw_distribution(tiny_llama_dir, extra):
    """A grammar changes which token is drawn, not the distribution reported: top_logprobs
    and the sampled token's logprob are those of a raw transformers forward (vLLM's default
    raw_logprobs, OpenAI's), not of the masked, penalised or temperature-scaled scores."""
    from astrai_batch.engine.sampling.constraints import Constraint

    loaded = load_model(tiny_llama_dir)
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=21, count=4)
    params = SamplingParams(
        max_tokens=8,
        top_logprobs=N,
        logprobs=True,
        constraint=Constraint("regex", r"[0-9]{3}-[a-z]{2,5}"),
        **extra,
    )
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    results, _ = generate_sync(loaded, requests, EngineConfig(page_size=8, num_pages=256))
    masked_out = 0
    for result in results:
        assert result.error is None
        prompt = prompts[result.request_id]
        reference = hf_logprobs(tiny_llama_dir, list(prompt) + list(result.token_ids))
        assert len(result.top_logprobs) == len(result.logprobs) == len(result.token_ids) > 0
        for k, (entry, logprob) in enumerate(
            zip(result.top_logprobs, result.logprobs, strict=True)
        ):
            row = reference[len(prompt) - 1 + k]
            assert_position(entry, row, result.token_ids[k])
            assert close(logprob, float(row[result.token_ids[k]]))
            assert logprob == entry.logprob
            # the raw top tokens include ones the grammar forbids here
            masked_out += entry.rank > 1
    assert masked_out > 0  # the grammar did override the model somewhere


def run_core(loaded, requests, config):
    """Every request added before the first step (one crowd), results by request id."""
    from astrai_batch.engine.core import EngineCore

    core = EngineCore(loaded, config)
    for request in requests:
        assert core.add_request(request) == []
    results = {}
    while core.num_unfinished:
        for result in core.step():
            results[result.request_id] = result
    core.close()
    return results


def test_prompt_logprobs_zero_ranks_are_the_same_alone_and_in_a_crowd(tiny_llama_dir):
    """prompt_logprobs=0 still reports each prompt token's rank (vLLM), and it is the real
    rank whether the row runs alone, beside rows asking for alternatives, or beside scoring
    rows: nothing a neighbour asks for changes a row's output."""
    from astrai_batch.engine.tasks.scoring_types import ScoreRequest

    loaded = load_model(tiny_llama_dir)
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=33, count=6)
    prompts[0] = prompts[1][:5] + prompts[2]  # 20 tokens
    zero = SamplingParams(max_tokens=2, prompt_logprobs=0)
    config = EngineConfig(page_size=8, num_pages=256)
    alone = run_core(loaded, [GenerationRequest(0, prompts[0], zero)], config)[0]
    crowd = [GenerationRequest(0, prompts[0], zero)]
    crowd += [
        GenerationRequest(i, p, SamplingParams(max_tokens=2, prompt_logprobs=3))
        for i, p in enumerate(prompts[1:4], start=1)
    ]
    crowd += [
        GenerationRequest(i, p, SamplingParams(), score=ScoreRequest(((5, 6, 7),)))
        for i, p in enumerate(prompts[4:], start=4)
    ]
    in_crowd = run_core(loaded, crowd, config)[0]
    reference = hf_logprobs(tiny_llama_dir, prompts[0])
    for p in range(1, len(prompts[0])):
        entry, other = alone.prompt_logprobs[p], in_crowd.prompt_logprobs[p]
        row = reference[p - 1]
        assert entry.top == other.top == ()
        assert entry.rank == other.rank == int((row > row[prompts[0][p]]).sum()) + 1
        assert close(entry.logprob, float(row[prompts[0][p]]))
        assert close(other.logprob, float(row[prompts[0][p]]))
