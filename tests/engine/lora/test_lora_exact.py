"""Each adapter's rows, greedy, equal transformers + PEFT token for token, in batches that mix
adapters and the base model; in invariant numerics a row's logits are bitwise the same
whatever ran beside it."""

from __future__ import annotations

import pytest
import torch
from engine_reference import mixed_prompts
from invariance_kit import invariance_prompts
from lora_kit import ATTENTION, make_adapter, peft_greedy

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.async_engine import generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.lora.adapter_files import read_adapter
from astrai_batch.engine.lora.bank import install_adapters, remove_adapters
from astrai_batch.engine.model.loader import load_model

MAX_NEW = 12
# name -> (rank, seed, targets)
ADAPTERS = {
    "r4": (4, 1, None),
    "r16": (16, 2, None),
    "attn": (8, 3, ATTENTION),
}


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"adapters-{tiny_model_dir.name}")
    dirs = {}
    for name, (rank, seed, targets) in ADAPTERS.items():
        extra = {} if targets is None else {"targets": targets}
        dirs[name] = make_adapter(tiny_model_dir, root / name, rank=rank, seed=seed, **extra)
    return dirs


@pytest.fixture(scope="module")
def loaded(tiny_model_dir, adapter_dirs):
    loaded = load_model(tiny_model_dir)
    adapters = [read_adapter(name, str(path)) for name, path in adapter_dirs.items()]
    install_adapters(loaded.model, adapters, max_rank=16)
    yield loaded
    remove_adapters(loaded.model)


def requests_for(prompts, names, max_new=MAX_NEW):
    params = SamplingParams(max_tokens=max_new)
    return [
        GenerationRequest(i, p, params, adapter=names[i % len(names)])
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize("numerics", ["invariant", "fast"])
def test_mixed_batch_equals_peft(loaded, tiny_model_dir, adapter_dirs, numerics):
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=7, count=16)
    names = [None, "r4", "r16", "attn"]
    config = EngineConfig(page_size=8, num_pages=512, numerics=numerics)
    results, _ = generate_sync(loaded, requests_for(prompts, names), config)
    differs = 0
    for name in names:
        rows = [i for i in range(len(prompts)) if names[i % len(names)] == name]
        path = None if name is None else adapter_dirs[name]
        want = peft_greedy(tiny_model_dir, path, [prompts[i] for i in rows], MAX_NEW)
        for i, expected in zip(rows, want, strict=True):
            assert list(results[i].token_ids) == expected, f"row {i} (adapter {name})"
        if name is not None:
            base = peft_greedy(tiny_model_dir, None, [prompts[i] for i in rows], MAX_NEW)
            differs += sum(b != w for b, w in zip(base, want, strict=True))
    assert differs >= 6  # the adapters change most rows: the comparison tests them


def logits_of(loaded, requests, config):
    core = EngineCore(loaded, config)
    seen = {}
    core.logits_observer = lambda rid, _i, row: seen.setdefault(rid, []).append(row.clone())
    for request in requests:
        assert core.add_request(request) == []
    while core.num_unfinished:
        core.step()
        core.check_invariants()
    core.close()
    return seen


def crowd_and_alone(loaded, requests):
    crowd = EngineConfig(page_size=8, num_pages=512, max_num_batched_tokens=96)
    single = EngineConfig(page_size=8, num_pages=128, enable_prefix_cache=False)
    mixed = logits_of(loaded, requests, crowd)
    alone = {}
    for request in requests:
        alone.update(logits_of(loaded, [request], single))
    return mixed, alone


def differing_rows(mixed, alone) -> list:
    return [
        rid
        for rid, rows in alone.items()
        if len(rows) != len(mixed[rid])
        or not all(torch.equal(a, b) for a, b in zip(rows, mixed[rid], strict=True))
    ]


def test_row_logits_do_not_depend_on_neighbours(loaded):
    """Invariant numerics: each row's logits, bitwise, alone and in a crowd mixing every
    adapter and the base (the protocol of test_batch_invariance: alone without the cache)."""
    prompts = invariance_prompts(loaded.model.config.vocab_size, 16, seed=5)
    base_rows = requests_for(prompts, [None], 6)
    if differing_rows(*crowd_and_alone(loaded, base_rows)):
        pytest.skip(
            "the base model's rows are not batch-invariant here (see test_batch_invariance)"
        )
    names = [None, "r4", "r16", "attn"]
    assert differing_rows(*crowd_and_alone(loaded, requests_for(prompts, names, 6))) == []


def test_cache_never_hits_across_adapters(loaded):
    """The same prompt under 4 names: each is a miss once, then hits only its own pages."""
    vocab = loaded.model.config.vocab_size
    prompt = mixed_prompts(vocab, seed=5, count=1)[0][:3] * 11  # 33 tokens: 4 full pages of 8
    names = [None, "r4", "r16", "attn"]
    params = SamplingParams(max_tokens=2)
    config = EngineConfig(page_size=8, num_pages=512)
    first = [GenerationRequest(f"a{n}", prompt, params, adapter=n) for n in names]
    second = [GenerationRequest(f"b{n}", prompt, params, adapter=n) for n in names]
    core = EngineCore(loaded, config)
    for request in first:
        core.add_request(request)
    results = []
    while core.num_unfinished:
        results += core.step()
    assert core.stats().cache.hit_tokens == 0
    for request in second:
        core.add_request(request)
    while core.num_unfinished:
        results += core.step()
    core.close()
    cached = {r.request_id: r.cached_tokens for r in results}
    assert cached == {**{f"a{n}": 0 for n in names}, **{f"b{n}": 32 for n in names}}
    assert core.stats().cache.hit_tokens == 4 * 32


def test_unknown_adapter_is_a_row_error(loaded):
    config = EngineConfig(page_size=8, num_pages=64)
    core = EngineCore(loaded, config)
    request = GenerationRequest(0, [5, 6, 7], SamplingParams(max_tokens=2), adapter="nope")
    (result,) = core.add_request(request)
    core.close()
    assert result.finish_reason == "error"
    assert result.error == "unknown LoRA adapter 'nope'; this job's adapters: r4, r16, attn"
