"""The decode graphs' static attention with sliding windows, softcapping and sinks (run eagerly
on CPU: capture aside, the same code). Invariant numerics promise a graphed decode the bits
of the eager block attention with the same layer's window, softcap and sinks: checked per
attention call against `block_attention` on random decode steps, and over whole engine runs
of Gemma 2 (windowed and softcapped) and gpt-oss (sinks, alternating windows) against the
same engine without the graph path. Fast numerics stay close to the eager steps."""

from __future__ import annotations

import random

import pytest
import torch
from engine.runner.test_decode_graphs import PAGE, SCRATCH, random_decodes
from engine.test_window_invariance import save_tiny
from invariance_kit import (
    GREEDY,
    SAMPLED,
    assert_same_rows,
    capture_rows,
    invariance_prompts,
    use_cuda_kernels_on_cpu,
)

from astrai_batch.engine import EngineConfig, GenerationRequest
from astrai_batch.engine.attention.block_attention import block_attention
from astrai_batch.engine.attention.block_plan import (
    BlockBatch,
    QuerySpan,
    block_tokens_for,
    plan_blocks,
)
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.static_decode import StaticDecodeBatch, static_decode_attention
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.blas_rows import attention_row_scheme
from astrai_batch.engine.runner import invariant_plan

NUM_PAGES = 256
FEATURES = {
    "window-20": dict(window=20),
    "window-100": dict(window=100),  # spans block boundaries (blocks of 64 keys)
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "all": dict(window=70, softcap=1.5, sinks=True),
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_static_attention_applies_the_layers_features_as_block_attention(name):
    features = FEATURES[name]
    q_heads, kv_heads, dim = 4, 2, 8
    torch.manual_seed(1)
    rng = random.Random(name)
    block = block_tokens_for(PAGE)
    keys = [torch.randn(NUM_PAGES * PAGE, kv_heads, dim) * 3]
    values = [torch.randn(NUM_PAGES * PAGE, kv_heads, dim)]
    window = features.get("window")
    softcap = features.get("softcap")
    sinks = torch.randn(q_heads) * 2 if features.get("sinks") else None
    free = [p for p in range(NUM_PAGES) if p != SCRATCH]
    rows = attention_row_scheme(dim, dim, block, 1024, torch.device("cpu"), torch.float32)
    for count, blocks, padded in [(1, 1, 2), (3, 2, 4), (7, 4, 8), (5, 3, 16)]:
        decodes = random_decodes(rng, count, blocks * block, free)
        spans = [QuerySpan(i, pos, 1, table) for i, (pos, table) in enumerate(decodes)]
        runs, units = plan_blocks(spans, PAGE, True, HostStaging("cpu"), window=window)
        eager = BlockBatch(
            keys, values, PAGE, block, torch.zeros(0), 0, runs, units, PageGatherer(), rows
        )
        q = torch.randn(count, q_heads, dim)
        expected = block_attention(q, keys[0], values[0], eager, 0.3, softcap, sinks)
        tables = torch.zeros(padded, blocks * (block // PAGE), dtype=torch.long)
        positions = torch.zeros(padded, dtype=torch.long)
        tables[count:, 0] = SCRATCH
        for i, (pos, table) in enumerate(decodes):
            tables[i, : len(table)] = torch.tensor(table)
            positions[i] = pos
        static = StaticDecodeBatch(
            keys, values, PAGE, block, blocks, torch.zeros(padded), positions, tables, 0, True, rows
        )
        q_padded = torch.cat([q, torch.randn(padded - count, q_heads, dim)])
        got = static_decode_attention(
            q_padded, keys[0], values[0], static, 0.3, window, softcap, sinks
        )
        assert torch.equal(got[:count], expected), f"{count} decodes in a bucket of {padded}"
        assert bool(torch.isfinite(got).all())
        if features == {"window": 20} and count == 7:  # the window binds: not full attention
            full = static_decode_attention(q_padded, keys[0], values[0], static, 0.3)
            assert not torch.equal(full[:count], got[:count])


MODELS = {
    "gemma2": (
        "gemma2",
        {"sliding_window": 24, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 4.0},
    ),
    "gpt_oss": (
        "gpt_oss",
        {"sliding_window": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}


@pytest.fixture
def block_attention_everywhere(monkeypatch):
    """Engines without graphs run the block attention too (as on CUDA): the graphs' promise
    is the eager block attention's bits (`test_decode_graphs`)."""
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda model, pool: None)


@pytest.mark.parametrize("name", list(MODELS))
def test_engine_with_graph_path_gives_the_same_rows(name, tmp_path, block_attention_everywhere):
    loaded = load_model(save_tiny(tmp_path / name, *MODELS[name]))
    prompts = invariance_prompts(loaded.model.config.vocab_size, 12, seed=5)
    requests = [
        GenerationRequest(i, prompts[i], SAMPLED if i % 2 else GREEDY) for i in range(len(prompts))
    ]
    config = EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=128, max_num_seqs=8)
    plain = capture_rows(EngineCore(loaded, config), requests)
    core = EngineCore(loaded, config, static_decode=True)
    graphed = capture_rows(core, requests)
    assert_same_rows(plain, graphed, range(len(prompts)))
    assert core.runner.decode_graphs.stats.graphed_steps > 0
    assert max(len(p) for p in prompts) > 4 * MODELS[name][1]["sliding_window"]


def test_fast_numerics_graph_path_stays_close(tmp_path):
    loaded = load_model(save_tiny(tmp_path / "gemma2", *MODELS["gemma2"]))
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=6)
    requests = [GenerationRequest(i, prompts[i], GREEDY) for i in range(len(prompts))]
    config = EngineConfig(page_size=8, num_pages=256, numerics="fast", max_num_seqs=8)
    plain = capture_rows(EngineCore(loaded, config), requests)
    core = EngineCore(loaded, config, static_decode=True)
    graphed = capture_rows(core, requests)
    assert core.runner.decode_graphs.stats.graphed_steps > 0
    for rid in range(len(prompts)):
        first = plain[rid][1][0]  # the prefill's logits: the same eager path
        assert torch.equal(first, graphed[rid][1][0])
        torch.testing.assert_close(graphed[rid][1][1], plain[rid][1][1], rtol=1e-4, atol=1e-4)


@pytest.mark.long  # Triton interpreted on CPU: minutes
def test_graph_path_gives_the_cuda_kernel_the_layers_features(tmp_path, monkeypatch):
    """With CUDA's invariant attention (Triton, interpreted here) the graphed decode passes
    each layer's window and the softcap to the eager steps' kernel: the same rows."""
    use_cuda_kernels_on_cpu(monkeypatch)
    loaded = load_model(save_tiny(tmp_path / "gemma2", *MODELS["gemma2"]))
    vocab = loaded.model.config.vocab_size
    rng = random.Random(4)
    shared = [rng.randrange(3, vocab) for _ in range(30)]
    prompts = [shared + [rng.randrange(3, vocab) for _ in range(n)] for n in (14, 3, 25)]
    requests = [GenerationRequest(i, prompts[i], SAMPLED if i % 2 else GREEDY) for i in range(3)]
    config = EngineConfig(page_size=8, num_pages=64, max_num_seqs=4)
    plain = capture_rows(EngineCore(loaded, config, invariance_probe=False), requests)
    core = EngineCore(loaded, config, static_decode=True, invariance_probe=False)
    assert core.runner.decode_graphs.invariant_kernel is not None
    assert_same_rows(plain, capture_rows(core, requests), range(3))
    assert core.runner.decode_graphs.stats.graphed_steps > 0
