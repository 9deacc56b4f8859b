"""Mixture-of-experts models under the default (invariant) numerics: a row's logits never
depend on what runs beside it, bitwise, although each expert's GEMM gets the rows the step
routed to it; and the invariant experts and routers compute what transformers' do.

Crowds: chunked prefills beside decodes (a budget of 48 tokens) in a pool small enough to
preempt, and one step holding every prompt with the prefix cache on. Routing ties (two experts
with the same router row, so every token scores them equally) included.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine.test_architectures_exact import CASES, save_tiny
from engine_reference import hf_greedy
from invariance_kit import (
    GREEDY,
    SAMPLED,
    assert_same_rows,
    invariance_prompts,
    requests_for,
    run_capturing,
)
from transformers import AutoModelForCausalLM

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.blas_rows import RowScheme
from astrai_batch.engine.runner.invariant_experts import (
    InvariantExperts,
    RowPaddedRouter,
    set_expert_tiling,
)

WATCHED = (0, 3, 4, 7)
PROMPTS = 10


def requests(prompts, ids):
    return [r for i in ids for r in requests_for(prompts, [i], SAMPLED if i % 2 else GREEDY)]


def tied_router_dir(tmp_path):
    """Mixtral whose experts 0 and 1 have the same router row in every layer: every token's
    scores tie, and top-2 must break the tie the same way alone and in a crowd."""
    model_type, overrides, _ = CASES["mixtral"]
    source = save_tiny(tmp_path / "mixtral", model_type, overrides)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight[1] = layer.mlp.gate.weight[0]
    model.save_pretrained(source)
    return source


@pytest.mark.parametrize("name", ["qwen3-moe", "qwen2-moe", "deepseek-v3", "glm4-moe", "ties"])
def test_a_moe_row_alone_equals_the_row_in_crowds(name, tmp_path):
    if name == "ties":
        model_dir = tied_router_dir(tmp_path)
    else:
        model_type, overrides, _ = CASES[name]
        model_dir = save_tiny(tmp_path / name, model_type, overrides)
    loaded = load_model(model_dir)
    prompts = invariance_prompts(loaded.model.config.vocab_size, PROMPTS, seed=9)
    base = EngineConfig(page_size=8, num_pages=96, enable_prefix_cache=False)
    alone = {}
    for i in WATCHED:
        alone.update(run_capturing(loaded, requests(prompts, [i]), base)[0])
    everyone = range(PROMPTS)
    crowds = [
        dataclasses.replace(base, max_num_batched_tokens=48, num_pages=30, max_num_seqs=8),
        dataclasses.replace(base, max_num_batched_tokens=2048, enable_prefix_cache=True),
    ]
    preempted = 0
    for config in crowds:
        crowd, stats = run_capturing(loaded, requests(prompts, everyone), config)
        assert_same_rows(alone, crowd, WATCHED)
        preempted += stats.preemptions
    assert preempted > 0
    experts = [m for m in loaded.model.modules() if isinstance(m, InvariantExperts)]
    assert len(experts) == len(loaded.model.model.layers) - (name.startswith(("deep", "glm")))
    if name == "ties":  # and the tie is broken as transformers breaks it
        greedy = [prompts[i] for i in WATCHED if i % 2 == 0]
        want = hf_greedy(model_dir, greedy, GREEDY.max_tokens)
        got = [list(alone[i][0]) for i in WATCHED if i % 2 == 0]
        assert got == want


def experts_and_router(name, tmp_path):
    model_type, overrides, _ = CASES[name]
    model = load_model(save_tiny(tmp_path / name, model_type, overrides)).model
    return model, model.model.layers[1].mlp


@pytest.mark.parametrize("name", ["qwen3-moe", "deepseek-v3"])
def test_invariant_experts_and_router_compute_what_transformers_does(name, tmp_path):
    """Against transformers' own experts (its default grouped_mm and the eager loop) and
    router: the same routing, outputs within float rounding; rows alone equal rows in a
    crowd bitwise, in blocks past the scheme's largest GEMM (16 rows here) too."""
    model, block = experts_and_router(name, tmp_path)
    router = block.gate
    experts = block.experts
    x = torch.randn(53, 64, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        want_logits, want_weights, want_index = router(x)
        want = experts(x, want_index, want_weights)
        model.config._experts_implementation = "eager"
        eager = experts(x, want_index, want_weights)
        scheme = RowScheme(min_rows=12, max_rows=16, pad_to=(0, *[12] * 11))
        swaps = 2 * sum(hasattr(layer.mlp, "experts") for layer in model.model.layers)
        assert set_expert_tiling(model, True, scheme) == swaps
        assert isinstance(block.gate, RowPaddedRouter) and isinstance(
            block.experts, InvariantExperts
        )
        logits, weights, index = block.gate(x)
        got = block.experts(x, index, weights)
        assert torch.equal(index, want_index)
        torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-6)
        # a different summation order than transformers' over the routed experts: float32
        # rounding of a few ulps on outputs near 1 (CI's CPU rounded one element 1.4e-6 off)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
        for start, stop in ((0, 1), (5, 9), (17, 30), (40, 53)):
            part = block.experts(x[start:stop], index[start:stop], weights[start:stop])
            assert torch.equal(part, got[start:stop])
            routed = block.gate(x[start:stop])
            for column, whole in zip(routed, (logits, weights, index), strict=True):
                assert torch.equal(column, whole[start:stop])
    names = [n for n, _ in model.named_parameters()]
    assert set_expert_tiling(model, False) == swaps
    assert [n for n, _ in model.named_parameters()] == names  # the same names either way
    assert block.gate is router and block.experts is experts


def test_the_start_up_probe_judges_the_experts(tmp_path, monkeypatch):
    """Without the invariant experts (transformers' grouped GEMM over the step's routed rows)
    the engine's start-up probe sees a row change in a crowd and refuses in one line."""
    from astrai_batch.engine.runner import invariant_plan
    from astrai_batch.errors import NumericsUnavailableError

    model_type, overrides, _ = CASES["qwen3-moe"]
    loaded = load_model(save_tiny(tmp_path / "qwen3-moe", model_type, overrides))
    monkeypatch.setattr(invariant_plan, "set_expert_tiling", lambda *args: 0)
    monkeypatch.setattr(invariant_plan, "refuse_variant_linears", lambda model: None)
    with pytest.raises(NumericsUnavailableError) as caught:
        run_capturing(loaded, [], EngineConfig(page_size=8, num_pages=64))
    assert "changed in a crowd" in str(caught.value)
    assert str(caught.value).endswith(
        "run with --fast-numerics to accept results that depend on the batch"
    )
