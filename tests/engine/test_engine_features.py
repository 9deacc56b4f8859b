"""Engine behaviour beyond greedy exactness: sampling, stops, n, errors, async API."""

from __future__ import annotations

import anyio
import pytest
from engine_reference import mixed_prompts

from astrai_batch.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    generate_sync,
)
from astrai_batch.engine.model.loader import load_model
from astrai_batch.errors import ConfigError

CONFIG = EngineConfig(page_size=8, num_pages=128, max_num_seqs=8)


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def prompts(loaded):
    return mixed_prompts(loaded.model.config.vocab_size, seed=7, count=8)


def sampled(seed, max_tokens=12):
    return SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=max_tokens)


def test_seeded_sampling_same_whatever_the_batch_and_order(loaded, prompts):
    target = GenerationRequest("target", prompts[0], sampled(seed=11))
    alone, _ = generate_sync(loaded, [target], CONFIG)
    others = [GenerationRequest(f"o{i}", p, sampled(seed=100 + i)) for i, p in enumerate(prompts)]
    crowded, _ = generate_sync(loaded, [*others[:5], target, *others[5:]], CONFIG)
    reversed_order, _ = generate_sync(loaded, [target, *reversed(others)], CONFIG)
    want = alone[0].token_ids
    assert len(want) == 12
    assert next(r for r in crowded if r.request_id == "target").token_ids == want
    assert next(r for r in reversed_order if r.request_id == "target").token_ids == want


def test_distinct_seeds_differ(loaded, prompts):
    requests = [GenerationRequest(s, prompts[1], sampled(seed=s, max_tokens=16)) for s in (1, 2)]
    results, _ = generate_sync(loaded, requests, CONFIG)
    assert results[0].token_ids != results[1].token_ids


def test_n_samples_share_the_prompt_pages(loaded, prompts):
    prompt = prompts[6]  # 64+ tokens: several full pages to share
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8)
    results, stats = generate_sync(loaded, [GenerationRequest("r", prompt, params)], CONFIG)
    assert [r.sample_index for r in results] == [0, 1, 2]
    assert len({r.token_ids for r in results}) == 3
    full_pages = (len(prompt) - 1) // 8 * 8
    # the first sample computes the prompt; the other two wait for its pages and hit them
    assert sorted(r.cached_tokens for r in results) == [0, full_pages, full_pages]
    assert stats.prefill_tokens == len(prompt) + 2 * (len(prompt) - full_pages)


def test_max_and_min_tokens(loaded, prompts):
    eos = min(loaded.eos_token_ids)
    params = SamplingParams(max_tokens=5, stop_token_ids=(eos,))
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompts[2], params)], CONFIG)
    assert results[0].completion_tokens <= 5
    long_run = SamplingParams(max_tokens=6, min_tokens=6, ignore_eos=True)
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompts[2], long_run)], CONFIG)
    assert results[0].completion_tokens == 6
    assert results[0].finish_reason == "length"


def test_stop_string_is_cut_from_the_text(loaded, prompts):
    free, _ = generate_sync(
        loaded, [GenerationRequest(0, prompts[3], SamplingParams(max_tokens=20))], CONFIG
    )
    text = free[0].text
    assert len(text) >= 6, text
    stop = text[3:6]
    first = text.find(stop)
    params = SamplingParams(max_tokens=20, stop=(stop,))
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompts[3], params)], CONFIG)
    assert results[0].finish_reason == "stop"
    assert results[0].text == text[:first]
    assert free[0].token_ids[: len(results[0].token_ids)] == results[0].token_ids


def test_logprobs_are_returned_per_token(loaded, prompts):
    params = SamplingParams(max_tokens=4, logprobs=True, ignore_eos=True)
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompts[4], params)], CONFIG)
    assert len(results[0].logprobs) == 4
    assert all(lp <= 0.0 for lp in results[0].logprobs)


def test_requests_that_can_never_fit_fail_alone(loaded, prompts):
    too_long = [5] * 1020
    requests = [
        GenerationRequest("ok", prompts[0], SamplingParams(max_tokens=4)),
        GenerationRequest("long", too_long, SamplingParams(max_tokens=8)),
        GenerationRequest("empty", [], SamplingParams(max_tokens=4)),
        GenerationRequest("vocab", [1, 99999], SamplingParams(max_tokens=4)),
    ]
    results, stats = generate_sync(loaded, requests, CONFIG)
    by_id = {r.request_id: r for r in results}
    assert by_id["ok"].finish_reason in ("stop", "length")
    assert by_id["long"].finish_reason == "error"
    assert by_id["long"].error == (
        "prompt (1020 tokens) + max_tokens (8) = 1028 exceeds the model context of 1024 tokens"
    )
    assert by_id["empty"].error == "prompt is empty"
    assert by_id["vocab"].error == "prompt token id 99999 is outside the vocabulary (size 384)"
    assert stats.requests_failed == 3


def test_request_larger_than_the_pool_fails_alone(loaded, prompts):
    config = EngineConfig(page_size=8, num_pages=4)
    request = GenerationRequest("big", list(range(3, 43)), SamplingParams(max_tokens=8))
    results, _ = generate_sync(loaded, [request], config)
    assert results[0].finish_reason == "error"
    assert results[0].error == (
        "prompt + max_tokens needs 6 KV pages but the cache holds only 4; "
        "raise --kv-cache-memory or lower max_tokens"
    )


def test_invalid_sampling_values_name_the_field():
    with pytest.raises(ConfigError) as err:
        SamplingParams(temperature=-1.0)
    assert str(err.value) == "temperature must be >= 0, got -1.0"


def test_engine_config_validation():
    with pytest.raises(ConfigError) as err:
        EngineConfig(max_num_seqs=0)
    assert str(err.value) == "max_num_seqs must be >= 1, got 0"
    with pytest.raises(ConfigError) as err:
        EngineConfig.from_dict({"bogus": 1})
    assert str(err.value) == "unknown engine option(s): bogus"


def test_async_generate_pulls_lazily_and_leaves_no_pages_in_use(loaded, prompts):
    config = EngineConfig(page_size=8, num_pages=128, max_num_seqs=2, lookahead=2)
    pulled = 0

    async def requests():
        nonlocal pulled
        for i in range(12):
            pulled += 1
            yield GenerationRequest(i, prompts[i % len(prompts)], SamplingParams(max_tokens=3))

    async def main():
        seen = []
        async with Engine(loaded, config) as engine:
            async for result in engine.generate(requests()):
                seen.append(result.request_id)
                # never more than running + waiting + the channel buffer + one in hand ahead
                assert pulled - len(seen) <= 2 + 2 + 2 + 1
            engine.core.check_invariants()
            cache = engine.stats().cache
            return seen, cache

    seen, cache = anyio.run(main)
    assert sorted(seen) == list(range(12))
    assert cache.pages_in_use == 0


class ConsumerFailed(Exception):
    pass


def test_an_error_in_the_consumer_reaches_the_caller_as_itself(loaded, prompts):
    async def main():
        async with Engine(loaded, CONFIG) as engine:
            async for _ in engine.generate(
                GenerationRequest(i, p, SamplingParams(max_tokens=2)) for i, p in enumerate(prompts)
            ):
                raise ConsumerFailed("writing the result failed")

    with pytest.raises(ConsumerFailed, match=r"^writing the result failed$"):
        anyio.run(main)


def test_an_error_in_the_requests_comes_after_the_results_already_sent(loaded, prompts):
    def requests():
        yield GenerationRequest(0, prompts[0], SamplingParams(max_tokens=2))
        yield GenerationRequest(1, prompts[1], SamplingParams(max_tokens=2))
        raise ValueError("row 2 could not be read")

    seen = []

    async def main():
        async with Engine(loaded, CONFIG) as engine:
            async for result in engine.generate(requests()):
                seen.append(result.request_id)

    with pytest.raises(ValueError, match=r"^row 2 could not be read$"):
        anyio.run(main)
    assert sorted(seen) == [0, 1]


def test_an_abandoned_generator_does_not_hold_the_engine_open(loaded, prompts):
    async def endless():
        index = 0
        while True:
            prompt = prompts[index % len(prompts)]
            yield GenerationRequest(index, prompt, SamplingParams(max_tokens=1))
            index += 1

    async def main():
        with anyio.fail_after(60):
            async with Engine(loaded, CONFIG) as engine:
                results = engine.generate(endless())
                async for result in results:
                    return result.request_id  # not closed: the engine's exit stops the feeder

    assert anyio.run(main) is not None
