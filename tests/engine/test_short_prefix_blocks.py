"""Short shared prefixes in the probed key blocks (`flash_probe.probe_flash_block`), end to
end on a tiny model in float32 (bfloat16 keeps 512-key blocks): a row alone equals the row
among prompts sharing prefixes of lengths around the block's boundaries (chunked prefill,
prefix hits, preemption), bitwise; and greedy output equals transformers `generate`.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_reference import bf16_near_tie, hf_greedy, hf_greedy_with_margins
from invariance_kit import GREEDY, assert_same_rows, requests_for, run_capturing

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model

PAGE = 8


def boundary_prompts(vocab: int, block: int, seed: int) -> list[list[int]]:
    """Prompts over prefixes of block - 8, block, block + 8 and 2 block + 40 tokens (each
    shared by three prompts with own tails of 1-30 tokens), and two unshared ones."""
    rng = random.Random(seed)

    def tokens(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    prompts = []
    for length in (block - 8, block, block + 8, 2 * block + 40):
        prefix = tokens(length)
        prompts += [prefix + tokens(rng.randint(1, 30)) for _ in range(3)]
    return [*prompts, tokens(block + 3), tokens(17)]


def test_bfloat16_keeps_the_kernels_own_512_key_blocks(tiny_llama_dir):
    """Short blocks are float32's: in bfloat16 each block's output is rounded before the fold
    (`flash_block_types.block_candidates`), so its prefixes around 512 keys are the block
    attention's tests' (tests/engine/test_batch_invariance.py)."""
    model = load_model(tiny_llama_dir, dtype="bfloat16")
    core = EngineCore(model, EngineConfig(page_size=PAGE, num_pages=64))
    assert core.runner.flash is None or core.runner.flash.block == 512


@pytest.fixture(scope="module", params=["float32"])
def loaded(request, tiny_llama_dir):
    model = load_model(tiny_llama_dir, dtype=request.param)
    core = EngineCore(model, EngineConfig(page_size=PAGE, num_pages=64))
    if core.runner.flash is None:
        pytest.skip("the CPU flash kernel keeps no key block here: the block attention runs")
    return model, core.runner.flash.block


@pytest.mark.parametrize(
    ("budget", "num_pages"), [(48, 512), (256, 60)], ids=["chunked", "preempt"]
)
def test_rows_alone_equal_in_crowds_sharing_prefixes_around_the_block(loaded, budget, num_pages):
    model, block = loaded
    prompts = boundary_prompts(model.model.config.vocab_size, block, seed=block)
    ids = range(len(prompts))
    alone = {}
    for i in ids:
        config = EngineConfig(page_size=PAGE, num_pages=128, enable_prefix_cache=False)
        alone.update(run_capturing(model, requests_for(prompts, [i], GREEDY), config)[0])
    config = EngineConfig(page_size=PAGE, num_pages=num_pages, max_num_batched_tokens=budget)
    crowd, stats = run_capturing(model, requests_for(prompts, ids, GREEDY), config)
    assert_same_rows(alone, crowd, ids)
    assert stats.cache.hit_tokens >= 2 * (block - 8)
    if num_pages == 60:
        assert stats.preemptions > 0


def test_greedy_equals_transformers_with_prefixes_around_the_block(loaded, tiny_llama_dir):
    model, block = loaded
    prompts = boundary_prompts(model.model.config.vocab_size, block, seed=block + 1)
    params = SamplingParams(max_tokens=12)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    config = EngineConfig(page_size=PAGE, num_pages=256, max_num_batched_tokens=96)
    results, stats = generate_sync(model, requests, config)
    assert stats.cache.hit_tokens > 0
    got = [list(r.token_ids) for r in results]
    if model.model.dtype == torch.float32:
        assert got == hf_greedy(tiny_llama_dir, prompts, 12)
        return
    # bfloat16: token for token up to a near-tie of transformers' own top two logits
    expected = hf_greedy_with_margins(tiny_llama_dir, prompts, 12, torch.bfloat16)
    for i, (have, (want, top2)) in enumerate(zip(got, expected, strict=True)):
        first = next((j for j, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), None)
        if first is not None:
            assert bf16_near_tie(*top2[first]), (i, first, top2[first])
