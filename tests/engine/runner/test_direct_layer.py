"""A fused layer's direct path (`direct_layer`): the fused steps' bits at every step it runs,
every layer of every step of a plain job on it, and the general path wherever a step is not
the common one."""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from invariance_kit import (
    assert_same_rows,
    capture_rows,
    invariance_prompts,
    mixed_requests,
    run_capturing,
)
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.converted import cache_root
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.packed_gemm import packing_supported
from astrai_batch.engine.runner import direct_layer, invariant_plan
from astrai_batch.engine.runner.fused_layers import FusedDecoderForward
from astrai_batch.engine.runner.layer_kernels import DirectCalls, load_layer_kernels

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.bfloat16, torch.device("cpu")),
    reason="this torch packs no bfloat16 weights (the direct path runs packed GEMMs)",
)

# hidden 128: every projection packs and q/k/v and gate/up merge (64-column ones do not);
# the Qwen2 one slides a 6-token window over every layer, shorter than its prompts
MODELS = {
    "llama": (LlamaConfig, {}),
    "qwen2-window": (
        Qwen2Config,
        {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 0},
    ),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def wide_model(request, tmp_path_factory):
    config_class, overrides = MODELS[request.param]
    tokenizer = build_tiny_tokenizer()
    kwargs = {**tiny_config_kwargs(tokenizer), "hidden_size": 128, "intermediate_size": 256}
    torch.manual_seed(78)
    config = config_class(**kwargs, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_model(path, dtype="bfloat16")


def _counting(monkeypatch) -> Counter:
    """Counts the direct path's calls and the ones it ran (not None)."""
    counts: Counter = Counter()
    real = direct_layer.DirectLayer.forward

    def counted(self, *args):
        out = real(self, *args)
        counts["calls"] += 1
        counts["ran"] += out is not None
        # steps past one GEMM's rows: the merged GEMMs and projections run in tiles
        counts["ran tiled"] += out is not None and args[0].shape[1] > self.fused.qkv.scheme.max_rows
        return out

    monkeypatch.setattr(direct_layer.DirectLayer, "forward", counted)
    return counts


def _layer_calls(monkeypatch) -> Counter:
    counts: Counter = Counter()
    real = FusedDecoderForward.__call__

    def counted(self, *args, **kwargs):
        counts["layers"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FusedDecoderForward, "__call__", counted)
    return counts


def _fused(loaded) -> list[FusedDecoderForward]:
    forwards = [m.__dict__.get("forward") for m in loaded.model.modules()]
    return [f for f in forwards if isinstance(f, FusedDecoderForward)]


CONFIG = EngineConfig(page_size=8, num_pages=128)  # invariant numerics: the CPU's C kernel


@pytest.mark.parametrize("numerics", ["invariant", "fast"])
def test_every_layer_of_every_step_runs_direct_with_the_fused_steps_bits(
    wide_model, numerics, monkeypatch
):
    """Greedy and sampled rows, prefill chunks beside decodes, a first step past one GEMM's
    rows, under both numerics (both attend with the C kernel in bfloat16): tokens and logits
    the same bits on the direct path as on `_fused` (the steps it calls straight), the direct
    path taken at every layer call of the job."""
    prompts = invariance_prompts(wide_model.model.config.vocab_size, 14, seed=5)
    config = replace(CONFIG, numerics=numerics, num_pages=512)
    layers, counts = _layer_calls(monkeypatch), _counting(monkeypatch)
    direct, _ = run_capturing(wide_model, mixed_requests(prompts, range(14)), config)
    assert len(_fused(wide_model)) == wide_model.model.config.num_hidden_layers
    assert counts["ran"] == counts["calls"] == layers["layers"] > 0
    # fast numerics runs a step's rows as one GEMM whatever their count (`RowScheme.whole`)
    assert (counts["ran tiled"] > 0) == (numerics == "invariant")
    monkeypatch.setattr(direct_layer.DirectLayer, "forward", lambda self, *args: None)
    general, _ = run_capturing(wide_model, mixed_requests(prompts, range(14)), config)
    assert_same_rows(general, direct, range(14))


def test_a_watched_projection_runs_the_general_path(wide_model, monkeypatch):
    """A forward hook on a layer's o projection (a probe, an adapter library): that layer
    calls the module, hook and all, as transformers would; a hook on every module: every
    layer does. Their rows do not change."""
    prompts = invariance_prompts(wide_model.model.config.vocab_size, 2, seed=6)
    plain, _ = run_capturing(wide_model, mixed_requests(prompts, range(2)), CONFIG)
    seen: Counter = Counter()
    core = EngineCore(wide_model, CONFIG)  # its numerics set the projections up
    first = _fused(wide_model)[0].layer.self_attn.o_proj
    counts = _counting(monkeypatch)
    with first.register_forward_hook(lambda module, args, out: seen.update(["o"])):
        hooked = capture_rows(core, mixed_requests(prompts, range(2)))
    layers = wide_model.model.config.num_hidden_layers
    assert seen["o"] > 0
    assert counts["calls"] == layers * seen["o"]  # one layer of each step on the general path
    assert counts["ran"] == (layers - 1) * seen["o"]
    assert_same_rows(plain, hooked, range(2))
    counts.clear()
    with torch.nn.modules.module.register_module_forward_hook(lambda *args: None):
        everywhere, _ = run_capturing(wide_model, mixed_requests(prompts, range(2)), CONFIG)
    assert counts["calls"] > 0 and counts["ran"] == 0
    assert_same_rows(plain, everywhere, range(2))


def test_another_attention_path_takes_the_general_path(wide_model, monkeypatch):
    """Where the C attention kernel does not run (no compiler: torch's flash kernel in
    blocks), the direct path declines every call."""
    prompts = invariance_prompts(wide_model.model.config.vocab_size, 2, seed=7)
    counts = _counting(monkeypatch)
    monkeypatch.setattr(invariant_plan, "_cpu_kernel", lambda memo, heads, pool: None)
    run_capturing(wide_model, mixed_requests(prompts, range(2)), CONFIG)
    assert counts["calls"] > 0 and counts["ran"] == 0


def test_a_finished_step_leaves_no_pool_held(wide_model):
    """The model outlives its engines: the step a model's layers shared is held weakly, so
    once a job is done nothing of its KV pools is kept."""
    prompts = invariance_prompts(wide_model.model.config.vocab_size, 2, seed=8)
    run_capturing(wide_model, mixed_requests(prompts, range(2)), CONFIG)
    gc.collect()
    jobs = {id(f.direct.jobs): f.direct.jobs for f in _fused(wide_model)}
    assert len(jobs) == 1  # one per model
    assert not next(iter(jobs.values())).holds_step


@pytest.fixture(scope="module")
def calls():
    return DirectCalls(load_layer_kernels(cache_root()))


def test_the_direct_calls_refuse_what_they_would_misread(calls):
    rows = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a bfloat16 weight of the rows' width"):
        calls.norm(rows, torch.ones(32, dtype=torch.bfloat16), 1e-5, 8, 1)
    pools = (torch.zeros(16, 1, 16, dtype=torch.bfloat16),) * 2
    projected = torch.zeros(4, 64, dtype=torch.bfloat16)  # q 32 | k 16 | v 16: fits
    angles = torch.zeros(4, 16, dtype=torch.bfloat16)
    slots = torch.arange(4)
    calls.rotary_into_pools(projected, (32, 16), angles, angles, 16, pools, slots, 1)
    with pytest.raises(ValueError, match="cannot take this step's rows"):
        calls.rotary_into_pools(projected, (16, 32), angles, angles, 16, pools, slots, 1)
    with pytest.raises(IndexError, match="outside the KV pool"):
        calls.rotary_into_pools(projected, (32, 16), angles, angles, 16, pools, slots + 13, 1)
