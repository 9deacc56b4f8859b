"""Windowed, softcapped models keep batch invariance: a row's logits alone equal its logits
in a crowd, bitwise, under the default numerics, through chunked prefill, prefix-cache hits
and preemption (recompute), at contexts past the window many times over.

Gemma 3 (windowed : global layers) runs its attention in the CPU flash kernel, with windows
that cut inside one 512-key block and windows that span block boundaries; Gemma 2
(softcapped scores and logits) in the block attention, and in CUDA's Triton kernel (run by
Triton's interpreter). Sinks (gpt-oss) are checked at the
attention level (`attention/test_flash_blocks.py`, `attention/test_block_window.py`): the
model's experts are refused under invariant numerics on this branch.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from engine_reference import hf_greedy
from invariance_kit import (
    GREEDY,
    SAMPLED,
    assert_same_rows,
    capture_rows,
    requests_for,
    run_capturing,
    use_cuda_kernels_on_cpu,
)
from transformers import AutoConfig, AutoModelForCausalLM

from astrai_batch.engine import EngineConfig, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.errors import ConfigError


def save_tiny(path: Path, model_type: str, overrides: dict) -> Path:
    tokenizer = build_tiny_tokenizer()
    kwargs = {**tiny_config_kwargs(tokenizer), "head_dim": 16, **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


MODELS = {
    "gemma3-window-16": (
        "gemma3_text",
        {
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 24,
        },
    ),
    "gemma2-softcap-window-24": (
        "gemma2",
        {"sliding_window": 24, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 4.0},
    ),
}


def prompts_for(vocab: int, seed: int, count: int) -> list[list[int]]:
    """`count` prompts of 20-125 tokens over 3 shared prefixes (prefix-cache hits)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(rng.randint(20, 60))] for _ in range(3)]
    return [
        prefixes[i % 3] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 65))]
        for i in range(count)
    ]


def params_of(i: int):
    return SAMPLED if i % 2 else GREEDY


def requests(prompts, ids):
    return [r for i in ids for r in requests_for(prompts, [i], params_of(i))]


def alone_rows(loaded, prompts, ids) -> dict:
    rows = {}
    for i in ids:
        config = EngineConfig(page_size=8, num_pages=256, enable_prefix_cache=False)
        rows.update(run_capturing(loaded, requests(prompts, [i]), config)[0])
    return rows


@pytest.mark.parametrize("name", list(MODELS))
def test_windowed_rows_alone_equal_in_crowd(name, tmp_path):
    loaded = load_model(save_tiny(tmp_path / name, *MODELS[name]))
    prompts = prompts_for(loaded.model.config.vocab_size, seed=3, count=24)
    watched = range(0, 24, 3)
    alone = alone_rows(loaded, prompts, watched)
    for budget, num_pages in ((64, 256), (256, 36)):  # chunked with cache hits; preempted
        config = EngineConfig(page_size=8, num_pages=num_pages, max_num_batched_tokens=budget)
        crowd, stats = run_capturing(loaded, requests(prompts, range(24)), config)
        assert_same_rows(alone, crowd, watched)
        assert stats.cache.hit_tokens > 0
        if num_pages == 36:
            assert stats.preemptions > 0
    core = EngineCore(loaded, EngineConfig(page_size=8, num_pages=64))
    # the flash kernel takes windows, not softcapping
    assert (core.runner.flash is None) == (name.startswith("gemma2"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_windows_across_key_blocks_alone_equal_in_crowd(tmp_path, dtype):
    """A window of 300 over contexts past 1024 keys in the flash kernel (float32): a query's
    window spans two 512-key blocks, blocks wholly before it are left out, decodes share
    whole prefix blocks; prefills chunked across block boundaries; preempted rows recomputed.
    In bfloat16 the CPU's C kernel walks the same windows over its 512-key splits."""
    overrides = dict(MODELS["gemma3-window-16"][1], sliding_window=300)
    overrides["max_position_embeddings"] = 2048
    model_dir = save_tiny(tmp_path / "gemma3-300", "gemma3_text", overrides)
    loaded = load_model(model_dir, dtype=dtype)
    runner = EngineCore(loaded, EngineConfig(page_size=8, num_pages=64)).runner
    if dtype == "bfloat16":
        assert runner.invariant_kernel.__qualname__ == "CpuKernel.attend"
    rng = random.Random(12)
    vocab = loaded.model.config.vocab_size

    def tokens(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix = tokens(1030)
    prompts = [prefix + tokens(n) for n in (20, 150)] + [tokens(n) for n in (700, 90)]
    ids = range(len(prompts))
    alone = alone_rows(loaded, prompts, ids)
    for budget, num_pages in ((256, 512), (200, 200)):
        config = EngineConfig(page_size=8, num_pages=num_pages, max_num_batched_tokens=budget)
        crowd, stats = run_capturing(loaded, requests(prompts, ids), config)
        assert_same_rows(alone, crowd, ids)
        if num_pages == 200:
            assert stats.preemptions > 0 and stats.cache.hit_tokens > 0
        else:
            assert stats.cache.hit_tokens >= 1024


@pytest.mark.long  # Triton interpreted on CPU (kernel-level: tests/engine/attention)
def test_the_cuda_kernel_applies_windows_and_softcapping(tmp_path, monkeypatch):
    """On CUDA the invariant Triton kernel (here through Triton's interpreter) takes each
    layer's window, the softcap and sinks per call: greedy tokens equal transformers', and a
    row alone equals the row beside chunked prefills, cache hits and preemptions."""
    use_cuda_kernels_on_cpu(monkeypatch)
    model_dir = save_tiny(tmp_path / "gemma2", *MODELS["gemma2-softcap-window-24"])
    loaded = load_model(model_dir)
    core = EngineCore(loaded, EngineConfig(page_size=8, num_pages=64), invariance_probe=False)
    assert core.runner.invariant_kernel is not None and core.runner.flash is None
    # few, short prompts (Triton's interpreter is slow), each past the window of 24
    rng = random.Random(4)
    shared = [rng.randrange(3, loaded.model.config.vocab_size) for _ in range(24)]
    prompts = [
        shared + [rng.randrange(3, loaded.model.config.vocab_size) for _ in range(n)]
        for n in (14, 3, 20, 9)
    ]
    plain = SamplingParams(max_tokens=12)  # ends at EOS, as `generate` does
    greedy = [r for i in range(2) for r in requests_for(prompts, [i], plain)]
    results, _ = generate_sync(loaded, greedy, EngineConfig(page_size=8, num_pages=64))
    assert [list(r.token_ids) for r in results] == hf_greedy(model_dir, prompts[:2], 12)
    watched = (0, 3)
    alone = {}
    for i in watched:
        config = EngineConfig(page_size=8, num_pages=64, enable_prefix_cache=False)
        engine = EngineCore(loaded, config, invariance_probe=False)
        alone.update(capture_rows(engine, requests(prompts, [i])))
    config = EngineConfig(page_size=8, num_pages=10, max_num_batched_tokens=32, max_num_seqs=4)
    engine = EngineCore(loaded, config, invariance_probe=False)
    assert_same_rows(alone, capture_rows(engine, requests(prompts, range(4))), watched)
    stats = engine.stats()
    assert stats.preemptions > 0 and stats.cache.hit_tokens > 0


def test_paths_that_do_not_apply_the_features_are_refused_in_one_line(tmp_path, monkeypatch):
    """A named paged kernel on a windowed softcapped model: one line naming what it lacks;
    `auto` falls back to the engine's own attention."""
    from astrai_batch.engine import engine_setup

    loaded = load_model(save_tiny(tmp_path / "gemma2", *MODELS["gemma2-softcap-window-24"]))
    monkeypatch.setattr(engine_setup, "resolve_attention_backend", lambda *a, **k: "flashinfer")
    with pytest.raises(ConfigError) as err:
        engine_setup.assemble_engine(
            loaded, EngineConfig(page_size=8, num_pages=16, attention_backend="flashinfer")
        )
    assert str(err.value) == (
        "--attention-backend flashinfer cannot run this model: it does not apply a sliding "
        "window (24 tokens) and attention logit softcapping (2.0); use --attention-backend sdpa"
    )
    parts = engine_setup.assemble_engine(loaded, EngineConfig(page_size=8, num_pages=16))
    assert parts.attention_backend == "sdpa" and parts.runner.attention_kernel is None
    # the decode graphs apply all three (`runner/test_decode_graphs_features`)
    parts = engine_setup.assemble_engine(
        loaded, EngineConfig(page_size=8, num_pages=16), static_decode=True
    )
    assert parts.runner.decode_graphs is not None
