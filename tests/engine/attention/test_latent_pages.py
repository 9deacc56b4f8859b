"""Multi-head latent attention over latent pages (`engine.attention.latent_pages`): the pool
holds one `kv_lora_rank + qk_rope_head_dim` vector per token and layer, and DeepSeek V2/V3
decode token-exact against transformers `generate` at contexts past page boundaries, with
chunked prefill, prefix hits and preemption, on every CPU attention path (the flash blocks,
the block attention, the step-shaped SDPA of --fast-numerics).

Tiny models (`test_architectures_exact`'s configs: latent 32 + rope 8, 4 heads of key 24 and
value 16, two layers); the bitwise crowd invariance of deepseek-v3 over these pages is in
`test_moe_invariance` (chunked, preempting and prefix-cached crowds).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine.test_architectures_exact import CASES, save_tiny
from engine_reference import hf_greedy, mixed_prompts

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.errors import ConfigError

MAX_NEW = 8
LATENT = 32 + 8  # kv_lora_rank + qk_rope_head_dim
PAGE = 8
CHUNK = 16  # every engine here prefills in chunks of 16 tokens (and shares one start-up probe)


@pytest.fixture(scope="module", params=["deepseek-v3", "deepseek-v2"])
def mla_model(request, tmp_path_factory):
    model_type, overrides, _ = CASES[request.param]
    model_dir = save_tiny(tmp_path_factory.mktemp(request.param), model_type, overrides)
    return model_dir, load_model(model_dir)


def run(loaded, prompts, config):
    core = EngineCore(loaded, config)
    params = SamplingParams(max_tokens=MAX_NEW)
    for i, prompt in enumerate(prompts):
        assert core.add_request(GenerationRequest(i, prompt, params)) == []
    tokens = {}
    while core.num_unfinished:
        for result in core.step():
            tokens[result.request_id] = list(result.token_ids)
    core.check_invariants()
    return [tokens[i] for i in range(len(prompts))], core.stats(), core


def test_the_pool_holds_one_latent_vector_per_token_and_layer(mla_model):
    _, loaded = mla_model
    assert (loaded.kv_latent, loaded.num_kv_heads, loaded.head_dim) == (True, 1, LATENT)
    _, _, core = run(
        loaded, [], EngineConfig(page_size=PAGE, num_pages=10, max_num_batched_tokens=CHUNK)
    )
    pool = core.pool
    assert pool.latent and pool.value_cache == []
    assert [tuple(t.shape) for t in pool.key_cache] == [(10 * PAGE, 1, LATENT)] * 2
    # float32: 2 layers x 8 tokens x 40 values x 4 bytes; the expanded layout would hold every
    # head's key (24) and its value padded to 24, for keys and values: 4.8x as much
    assert KVPool.bytes_per_page(**_page_args(loaded)) == 2 * PAGE * LATENT * 4 == 2560
    expanded = KVPool.bytes_per_page(
        num_layers=2, num_kv_heads=4, head_dim=24, page_size=PAGE, dtype=torch.float32
    )
    assert expanded == 12288
    assert pool.memory_bytes == 10 * 2560


def test_the_memory_budget_counts_latent_bytes(mla_model):
    """--kv-cache-memory buys pages at the latent's price: 37 of 2,560 bytes in 95,000."""
    _, loaded = mla_model
    config = EngineConfig(
        page_size=PAGE, kv_cache_memory=95_000, max_num_seqs=64, max_num_batched_tokens=CHUNK
    )
    _, _, core = run(loaded, [], config)
    assert core.pool.num_pages == 37


def _page_args(loaded) -> dict:
    return dict(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=PAGE,
        dtype=torch.float32,
        latent=True,
    )


def test_greedy_equals_transformers_on_every_attention_path(mla_model):
    """Prompts of 20-125 tokens (many pages of 8), two sharing prefixes, packed in one engine
    in 16-token chunks: on the flash blocks in a pool small enough to preempt, on the block
    attention (a page of 12 does not divide the flash kernel's 512-key blocks) and on the
    step-shaped path (--fast-numerics); against transformers one prompt at a time. (The
    unchunked flash-block run is `test_architectures_exact`'s. DeepSeek V2 differs in its rope
    and routing only: it runs the flash blocks alone, to keep the suite's time.)"""
    model_dir, loaded = mla_model
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=5, shared=True, count=5)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    base = EngineConfig(page_size=PAGE, num_pages=22, max_num_seqs=4, max_num_batched_tokens=CHUNK)
    configs = {
        "flash blocks, preempting": base,
        "block attention": dataclasses.replace(base, page_size=12, num_pages=64),
        "fast numerics": dataclasses.replace(base, numerics="fast", num_pages=64),
    }
    if loaded.model.config.model_type == "deepseek_v2":
        configs = {"flash blocks, preempting": base}
    preempted = hits = 0
    for name, config in configs.items():
        got, stats, core = run(loaded, prompts, config)
        assert got == expected, name
        preempted += stats.preemptions
        hits += stats.cache.hit_tokens
        assert (core.runner.flash is not None) == name.startswith("flash"), name
    assert preempted > 0 and hits > 0


def test_graphs_and_paged_kernels_are_refused_for_latent_pages(mla_model):
    _, loaded = mla_model
    from astrai_batch.engine.runner.model_runner import ModelRunner

    pool = KVPool(num_pages=4, device="cpu", **_page_args(loaded))
    with pytest.raises(ValueError, match="do not read latent pages"):
        ModelRunner(loaded.model, pool, numerics="fast", attention_kernel=object())
    with pytest.raises(ConfigError, match="num_kv_heads must be 1, got 4"):
        KVPool(num_pages=4, device="cpu", **{**_page_args(loaded), "num_kv_heads": 4})
