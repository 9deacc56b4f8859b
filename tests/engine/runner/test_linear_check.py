"""Quantized (non-plain) linear layers under invariant numerics: refused with one line naming
--fast-numerics, never silently variant; with fast numerics they run, and greedy tokens agree
with transformers' `generate` on the same quantized model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.errors import ConfigError

PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [100, 7, 300]]


class ScaledLinear(nn.Linear):
    """A layer with its own forward, as a quantizer's layer has."""

    def forward(self, x):
        return super().forward(x) * 1.0


def _generate(loaded, numerics: str) -> list[list[int]]:
    core = EngineCore(loaded, EngineConfig(num_pages=32, numerics=numerics))
    for i, prompt in enumerate(PROMPTS):
        core.add_request(GenerationRequest(i, prompt, SamplingParams(max_tokens=6)))
    out = {}
    while core.num_unfinished:
        for result in core.step():
            out[result.request_id] = list(result.token_ids)
    core.close()
    return [out[i] for i in range(len(PROMPTS))]


def test_a_linear_subclass_is_refused_in_invariant_mode(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir)
    old = loaded.model.model.layers[1].mlp.up_proj
    new = ScaledLinear(old.in_features, old.out_features, bias=False)
    new.weight = old.weight
    loaded.model.model.layers[1].mlp.up_proj = new
    with pytest.raises(ConfigError) as refused:
        EngineCore(loaded, EngineConfig(num_pages=32))
    assert str(refused.value) == (
        f"layer model.layers.1.mlp.up_proj ({ScaledLinear.__module__}.ScaledLinear) has no "
        "batch-invariant form, so invariant numerics cannot hold; run with --fast-numerics "
        "(a row's output may then depend on its batch)"
    )
    assert len(_generate(loaded, "fast")) == len(PROMPTS)


def test_torchao_int8_weight_only(tiny_llama_dir):
    torchao = pytest.importorskip("torchao.quantization")
    from transformers import AutoModelForCausalLM

    loaded = load_model(tiny_llama_dir)
    torchao.quantize_(loaded.model, torchao.Int8WeightOnlyConfig())
    with pytest.raises(ConfigError) as refused:
        EngineCore(loaded, EngineConfig(num_pages=32))
    assert str(refused.value).startswith(
        "layer model.layers.0.self_attn.q_proj (nn.Linear with Int8Tensor weights) has no "
        "batch-invariant form"
    )
    ours = _generate(loaded, "fast")
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    torchao.quantize_(reference, torchao.Int8WeightOnlyConfig())
    theirs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = reference.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=6,
                do_sample=False,
                pad_token_id=reference.config.pad_token_id,
            )
            theirs.append(out[0, len(prompt) :].tolist())
    assert ours == theirs


class QuantLinear(nn.Module):
    """GPTQ-style: its own packed weights and kernel, not an nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("qweight", torch.zeros(8, 4, dtype=torch.int32))


class LoraWrapper(nn.Module):
    """PEFT-style: products done by plain nn.Linear children (tiled like any other)."""

    def __init__(self) -> None:
        super().__init__()
        self.base_layer = nn.Linear(4, 4)
        self.lora_A = nn.Linear(4, 2, bias=False)


class LinearScalingRotaryEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(2))


def test_which_layers_are_variant():
    from astrai_batch.engine.runner.linear_check import variant_linear

    assert variant_linear(nn.Sequential(LoraWrapper(), LinearScalingRotaryEmbedding())) is None
    found = variant_linear(nn.Sequential(LoraWrapper(), QuantLinear()))
    assert found == f"1 ({QuantLinear.__module__}.QuantLinear)"
