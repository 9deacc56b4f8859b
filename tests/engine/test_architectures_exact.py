"""Every architecture on the allow-list runs token-exact against transformers `generate`
under the default (invariant) numerics, mixture-of-experts and latent-attention models too.

Each case is a tiny random model (2 layers, hidden size 64) saved as an ordinary model
directory and loaded by the real loader; its prompts share prefixes and run packed in one
engine, while the reference runs them one at a time. The configs that are exact only up to a
context length (sliding window, longrope, dynamic NTK) run at a context within it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from engine_reference import bf16_near_tie, hf_greedy, hf_greedy_with_margins, mixed_prompts
from transformers import AutoConfig, AutoModelForCausalLM

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.model.support import SUPPORTED_MODEL_TYPES
from astrai_batch.errors import ConfigError

MAX_NEW = 10
HEAD_DIM = 16
ROTARY_HALF = HEAD_DIM // 2  # longrope wants one factor per rotary frequency
WINDOW = 16  # past every window: prompts of 20-125 tokens hold several

# DeepSeek's multi-head latent attention at a tiny size: every head its own expanded keys
MLA = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}

# name -> (model_type, config overrides, max_model_len given to the loader)
CASES: dict[str, tuple[str, dict, int | None]] = {
    "llama": ("llama", {}, None),
    "llama-llama3-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            }
        },
        None,
    ),
    "llama-dynamic-ntk": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
        None,
    ),
    "mistral-window-at-context": ("mistral", {"sliding_window": 1024}, None),
    # windows far below the prompts (20-125 tokens): every windowed layer cuts, many times
    "mistral-window-below-context": ("mistral", {"sliding_window": WINDOW}, None),
    "qwen2": ("qwen2", {"use_sliding_window": False}, None),
    "qwen2-sliding-layers": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
        None,
    ),
    # softcapped scores and logits, a query pre-attention scalar, windowed : global layers
    "gemma2": (
        "gemma2",
        {
            "head_dim": HEAD_DIM,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 4.0,
        },
        None,
    ),
    "gemma3-text": (
        "gemma3_text",
        {
            "head_dim": HEAD_DIM,
            "num_hidden_layers": 4,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "query_pre_attn_scalar": 24,
        },
        None,
    ),
    # learned sinks, alternating windowed and global layers (and experts: fast numerics)
    "gpt-oss": (
        "gpt_oss",
        {
            "head_dim": HEAD_DIM,
            "sliding_window": WINDOW,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        None,
    ),
    # An explicit head_dim other than hidden_size / heads (64 / 4 = 16).
    "qwen3": ("qwen3", {"head_dim": 32}, None),
    "gemma": ("gemma", {"head_dim": 32}, None),
    "granite": (
        "granite",
        {
            "attention_multiplier": 0.2,
            "embedding_multiplier": 3.0,
            "residual_multiplier": 0.5,
            "logits_scaling": 2.0,
        },
        None,
    ),
    "olmo": ("olmo", {"clip_qkv": 4.0}, None),
    "olmo2": ("olmo2", {}, None),
    "phi3": ("phi3", {"partial_rotary_factor": 0.5}, None),
    "phi3-longrope-within-short": (
        "phi3",
        {
            "original_max_position_embeddings": 256,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + i / 10 for i in range(ROTARY_HALF)],
                "long_factor": [2.0 + i for i in range(ROTARY_HALF)],
            },
        },
        256,
    ),
    "smollm3": ("smollm3", {}, None),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, None),
    "qwen2-moe": (
        "qwen2_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
        },
        None,
    ),
    "qwen3-moe": (
        "qwen3_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "head_dim": HEAD_DIM,
        },
        None,
    ),
    "olmoe": ("olmoe", {"num_experts": 4, "num_experts_per_tok": 2}, None),
    "granitemoe": ("granitemoe", {"num_local_experts": 4, "num_experts_per_tok": 2}, None),
    # multi-head latent attention (q through a low-rank q_a/q_b pair, keys and values from a
    # 32-wide latent), its first layer dense, then routed experts with a shared expert: V2's
    # softmax greedy routing with routed scaling, V3's sigmoid scores with a bias-corrected
    # group choice (2 of 4 groups) and normalized, scaled weights
    "deepseek-v2": (
        "deepseek_v2",
        {
            **MLA,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "routed_scaling_factor": 1.5,
        },
        None,
    ),
    "deepseek-v2-group-limited": (
        "deepseek_v2",
        {
            **MLA,
            "q_lora_rank": None,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 2,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
        },
        None,
    ),
    "deepseek-v3": (
        "deepseek_v3",
        {
            **MLA,
            "n_routed_experts": 16,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
        },
        None,
    ),
    "glm4-moe": (
        "glm4_moe",
        {
            "head_dim": HEAD_DIM,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "use_qk_norm": True,
        },
        None,
    ),
    "olmo3-sliding-layers": ("olmo3", {"sliding_window": 4096}, None),
    "starcoder2": ("starcoder2", {"sliding_window": None}, None),
    "phi": ("phi", {"partial_rotary_factor": 0.5, "qk_layernorm": True}, None),
    "cohere": ("cohere", {"use_qk_norm": True, "logit_scale": 0.5}, None),
    "glm": ("glm", {"head_dim": HEAD_DIM}, None),
    "helium": ("helium", {"head_dim": HEAD_DIM}, None),
    "arcee": ("arcee", {}, None),
    "apertus": ("apertus", {}, None),
    "seed-oss": ("seed_oss", {"head_dim": HEAD_DIM}, None),
    "ernie4_5": ("ernie4_5", {}, None),
    "hunyuan-v1-dense": ("hunyuan_v1_dense", {"head_dim": HEAD_DIM}, None),
}


# bfloat16 on one case per family of kernels (biases, fused qkv, q/k norms, LayerNorm,
# partial rotary, scaled logits, tied-free heads), to keep CI's time. Not the mixtures of
# experts: a router's top-k choice is itself a near-tie decision in bfloat16 (measured:
# qwen2-moe's prompt 4 leaves transformers at a top-2 gap of 0.72)
BF16_CASES = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma",
    "granite",
    "olmo2",
    "phi3",
    "phi",
    "cohere",
    "starcoder2",
)


def save_tiny(path: Path, model_type: str, overrides: dict) -> Path:
    tokenizer = build_tiny_tokenizer()
    config = AutoConfig.for_model(model_type, **{**tiny_config_kwargs(tokenizer), **overrides})
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    torch.manual_seed(99)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for module in model.modules():
        bias = getattr(module, "e_score_correction_bias", None)
        if bias is not None:  # DeepSeek V3 / GLM-4.5 start at zero: make the correction count
            bias.copy_(torch.rand(bias.shape, generator=torch.Generator().manual_seed(3)) * 0.4)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_every_allowed_model_type_has_a_case():
    assert {model_type for model_type, _, _ in CASES.values()} == SUPPORTED_MODEL_TYPES


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(name, "float32") for name in CASES] + [(name, "bfloat16") for name in BF16_CASES],
)
def test_packed_greedy_output_equals_transformers(name, dtype, tmp_path):
    """In both dtypes: transformers runs the dtype the engine does. In bfloat16 the logits
    themselves are bfloat16 (a step of 1/16 at 10), so two can tie; transformers' GEMMs run
    at each call's row count and its attention over the whole prompt, ours on fixed tiles and
    512-key blocks: equally valid summation orders whose last bits differ. A row may then
    leave transformers' tokens only where transformers' own top two logits are within two
    bfloat16 steps (measured: qwen2's prompt 2 at its 4th token, an exact tie)."""
    model_type, overrides, max_model_len = CASES[name]
    model_dir = save_tiny(tmp_path / name, model_type, overrides)
    loaded = load_model(model_dir, max_model_len=max_model_len, dtype=dtype)
    if max_model_len is not None:
        assert loaded.max_model_len == max_model_len
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=5, shared=True, count=6)
    prompts.append(prompts[0][:9])  # a short one packed beside the long ones
    # the default numerics (invariant), mixture-of-experts models included
    config = EngineConfig(page_size=8, num_pages=128, max_num_batched_tokens=96)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    if dtype == "float32":
        expected = hf_greedy(model_dir, prompts, MAX_NEW)
        for i, (result, want) in enumerate(zip(results, expected, strict=True)):
            assert list(result.token_ids) == want, f"{name}: prompt {i} (len {len(prompts[i])})"
    else:
        expected = hf_greedy_with_margins(model_dir, prompts, MAX_NEW, torch.bfloat16)
        exact = 0
        for i, (result, (want, top2)) in enumerate(zip(results, expected, strict=True)):
            got = list(result.token_ids)
            first = next(
                (j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None
            )
            exact += first is None
            if first is not None:
                assert bf16_near_tie(*top2[first]), (
                    f"{name}: prompt {i} leaves transformers at token {first}, top two "
                    f"logits {top2[first]}"
                )
        assert exact >= len(prompts) - 2, f"{name}: only {exact} rows exact"
    assert stats.cache.hit_tokens > 0  # shared prefixes were read from the pool


def test_invariant_numerics_refuse_stacked_weights_they_cannot_run(tmp_path):
    """3-D weights outside a transformers experts module (here beside a Mixtral block) have no
    invariant form: refused in one line naming the layer and --fast-numerics."""
    model_type, overrides, _ = CASES["mixtral"]
    loaded = load_model(save_tiny(tmp_path / "mixtral", model_type, overrides))
    foreign = torch.nn.Module()
    foreign.weight = torch.nn.Parameter(torch.zeros(2, 64, 64))
    loaded.model.model.layers[1].mlp.add_module("foreign", foreign)
    with pytest.raises(ConfigError) as caught:
        generate_sync(loaded, [], EngineConfig(page_size=8, num_pages=64))
    assert str(caught.value) == (
        "layer model.layers.1.mlp.foreign (Module) multiplies stacked 3-D weights in a way the "
        "engine has no batch-invariant form for, so invariant numerics cannot hold; run with "
        "--fast-numerics (a row's output may then depend on its batch)"
    )
