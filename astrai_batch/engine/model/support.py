"""Which model architectures the engine can run exactly, decided from the config alone.

The engine plugs paged attention over a shared KV pool into transformers' attention interface
and runs many sequences packed into one forward. That is only exact for plain causal
self-attention whose every input is a function of the token and its own position, so:

- refused outright: anything that changes which keys a query sees beyond causality and a
  sliding window (bidirectional attention, recurrent state, cross-attention, attention kinds
  other than full and sliding-window), rope scalings we do not know, and architectures off
  the list;
- refused unless the context is short enough: features that are exact only while every
  sequence stays within a limit. longrope picks its short or long factors, and dynamic NTK
  rescales, from the longest position in the forward (in a packed batch: the longest sequence
  beside this one), and do neither while every position is below their threshold. Such a
  model runs when its context (`max_model_len`) is within the limit and is refused otherwise,
  with the limit in the message.

Sliding windows (per layer, `layer_types`), learned attention sinks, attention-logit and
final-logit softcapping and query pre-attention scalars run at any context: the paged
attention applies the first three itself (`attention.score_features`), the model's own
forward the last two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astrai_batch.errors import UnsupportedModelError

if TYPE_CHECKING:
    from astrai_batch.engine.model.loaded import LoadedModel

# Decoder-only model types whose attention goes through transformers' attention interface
# with full causal attention, so the engine's paged attention can stand in for it.
# Each has a tiny-model greedy test against transformers (tests/engine/test_architectures_exact.py).
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "apertus",
        "arcee",
        "cohere",
        "deepseek_v2",
        "deepseek_v3",
        "ernie4_5",
        "gemma",
        "gemma2",
        "gemma3_text",
        "glm",
        "glm4_moe",
        "gpt_oss",
        "granite",
        "granitemoe",
        "helium",
        "hunyuan_v1_dense",
        "llama",
        "mistral",
        "mixtral",
        "olmo",
        "olmo2",
        "olmo3",
        "olmoe",
        "phi",
        "phi3",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "seed_oss",
        "smollm3",
        "starcoder2",
    }
)

# Model types that keep recurrent or state-space state instead of (or next to) a KV cache, and
# the layers that keep it (named in the refusal). What running them would take: docs/models.md.
_MAMBA = "Mamba state-space layers"
_MAMBA2 = "Mamba2 state-space layers"
RECURRENT_LAYER_KINDS: dict[str, str] = {
    "bamba": _MAMBA2,
    "falcon_h1": "Mamba2 state-space heads beside its attention heads",
    "falcon_mamba": _MAMBA,
    "granitemoehybrid": _MAMBA2,
    "jamba": _MAMBA,
    "kimi_linear": "Kimi Delta Attention (linear attention) layers",
    "lfm2": "gated short-convolution layers",
    "lfm2_moe": "gated short-convolution layers",
    "mamba": _MAMBA,
    "mamba2": _MAMBA2,
    "minimax": "lightning (linear) attention layers",
    "nemotron_h": _MAMBA2,
    "plamo2": _MAMBA2,
    "qwen3_next": "Gated DeltaNet (linear attention) layers",
    "recurrent_gemma": "RG-LRU recurrent layers",
    "rwkv": "RWKV time-mixing layers",
    "xlstm": "mLSTM recurrent layers",
    "zamba": _MAMBA,
    "zamba2": _MAMBA2,
}
RECURRENT_MODEL_TYPES: frozenset[str] = frozenset(RECURRENT_LAYER_KINDS)

_MULTIMODAL_SUBCONFIGS = ("vision_config", "text_config", "audio_config")

# Vision-language model types the engine runs: their language model (text_config) on the
# paged path, checked like a text model, their vision tower by transformers
# (`engine.vision.tower`); each with a tiny random-weight test against transformers
# (tests/engine/vision/test_llava_exact.py, test_llava_next_exact.py, test_qwen_vl_exact.py,
# test_gemma3_exact.py, test_idefics3_exact.py).
VISION_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "llava",
        "llava_next",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "gemma3",
        "idefics3",
        "smolvlm",
        "mistral3",
    }
)
# language models that run only as a vision model's half (no causal-LM class of their own):
# Qwen2's or Qwen3's decoder with multimodal rotary positions (`engine.vision.qwen_vl_tower`)
VISION_LANGUAGE_MODEL_TYPES: frozenset[str] = frozenset(
    {"qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text"}
)


def is_vision_model(config: Any) -> bool:
    return getattr(config, "model_type", None) in VISION_MODEL_TYPES


def language_config(config: Any) -> Any:
    """The config of the model's language part: a vision-language model's text config,
    else the config itself."""
    return config.text_config if is_vision_model(config) else config


_ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention"})

# Rope scalings computed once at load from the config alone (transformers'
# `ROPE_INIT_FUNCTIONS`), so the same for every batch.
_STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn", "proportional"})
# Rope scalings that `dynamic_rope_update` recomputes in the forward from the largest position
# in it: exact only below a threshold (`exact_context_limit`).
_LIMITED_ROPE_TYPES = frozenset({"dynamic", "longrope"})


def describe_model(config: Any) -> str:
    """How messages name a model: its first listed architecture, else its model type."""
    architectures = getattr(config, "architectures", None)
    if architectures:
        return str(architectures[0])
    return f"model type {getattr(config, 'model_type', None)!r}"


def unsupported_reason(config: Any, vision_half: bool = False) -> str | None:
    """Why the engine cannot run this config at any context length, or None when it can.
    `vision_half`: the config is a vision model's language model.

    Specific reasons come before the allow-list so a refused model says what is wrong with it,
    not only that it is missing from the list.
    """
    model_type = getattr(config, "model_type", None)
    if is_vision_model(config):
        tower_type = getattr(getattr(config, "vision_config", None), "model_type", None)
        if model_type == "llava" and tower_type == "pixtral":
            # Pixtral-12B: its images are rows broken by [IMG_BREAK] (Mistral 3's layout),
            # which LLaVA's fixed count per image does not describe
            return (
                "a LLaVA with a Pixtral vision tower (Pixtral-12B) is not run: its image "
                "rows are broken by [IMG_BREAK]; Mistral 3 (mistral3) models run"
            )
        reason = unsupported_reason(config.text_config, vision_half=True)
        return None if reason is None else f"its language model is not supported: {reason}"
    if getattr(config, "vision_config", None) is not None:
        return (
            f"it is a vision-language model of a type the engine does not run "
            f"(vision-language model types: {', '.join(sorted(VISION_MODEL_TYPES))})"
        )
    for name in _MULTIMODAL_SUBCONFIGS:
        if getattr(config, name, None) is not None:
            return f"it is multimodal (the config has a {name})"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    if model_type in RECURRENT_MODEL_TYPES:
        return (
            f"it has {RECURRENT_LAYER_KINDS[model_type]}, which carry a recurrent state per "
            "sequence where the engine pages keys and values"
        )
    if getattr(config, "num_attention_heads", None) is None:
        return "it has no standard attention (no num_attention_heads)"
    if getattr(config, "use_bidirectional_attention", False):
        return "it uses bidirectional attention (use_bidirectional_attention=True)"
    layer_types = getattr(config, "layer_types", None) or ()
    others = sorted({kind for kind in layer_types if kind not in _ATTENTION_KINDS})
    if others:
        return f"it has layers without full or sliding-window attention ({', '.join(others)})"
    for rope_type in _rope_types(config):
        if rope_type not in _STATIC_ROPE_TYPES and rope_type not in _LIMITED_ROPE_TYPES:
            return f"it uses rope_type {rope_type!r}, which the engine does not know to be exact"
    v_dim, qk_dim = getattr(config, "v_head_dim", None), getattr(config, "qk_nope_head_dim", None)
    if getattr(config, "kv_lora_rank", None) is not None and v_dim is not None and qk_dim:
        key_dim = qk_dim + int(getattr(config, "qk_rope_head_dim", 0) or 0)
        if v_dim > key_dim:
            return (
                f"its latent attention's values are wider than its keys (v_head_dim={v_dim} > "
                f"qk_nope_head_dim + qk_rope_head_dim = {key_dim})"
            )
    if model_type not in SUPPORTED_MODEL_TYPES and not (
        vision_half and model_type in VISION_LANGUAGE_MODEL_TYPES
    ):
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        return f"only these model types are supported: {supported}"
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(str(a).endswith("ForCausalLM") for a in architectures):
        listed = ", ".join(str(a) for a in architectures)
        return f"it has no causal-LM head (architectures: {listed})"
    return None


def exact_context_limit(config: Any) -> tuple[int, str] | None:
    """The longest context (in tokens) the engine runs this config exactly at, and why; None
    when no feature of the config limits it."""
    config = language_config(config)
    limits: list[tuple[int, str]] = []
    for params in _rope_parameter_sets(config):
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        if rope_type == "longrope":
            threshold = params.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", None
            )
            if threshold is not None:
                limits.append(
                    (
                        int(threshold),
                        f"longrope scaling (original_max_position_embeddings={threshold}; "
                        "its factors switch with the longest sequence in a batch)",
                    )
                )
        elif "dynamic" in rope_type:
            threshold = getattr(config, "max_position_embeddings", None)
            if threshold is not None:
                limits.append(
                    (
                        int(threshold),
                        f"dynamic rope scaling (max_position_embeddings={threshold}; it "
                        "rescales with the longest sequence in a batch)",
                    )
                )
    return min(limits, default=None)


def check_supported(config: Any, max_model_len: int | None = None) -> None:
    """Raise `UnsupportedModelError` naming the architecture and the reason, if unsupported.

    With `max_model_len` (the context the engine will run at) the features that are exact
    only up to some length are checked against it too.
    """
    reason = unsupported_reason(config)
    if reason is not None:
        raise UnsupportedModelError(f"{describe_model(config)} is not supported: {reason}")
    limit = exact_context_limit(config) if max_model_len is not None else None
    if limit is not None and max_model_len > limit[0]:
        tokens, what = limit
        raise UnsupportedModelError(
            f"{describe_model(config)} is not supported with a context of {max_model_len} "
            f"tokens: it uses {what}, so it runs exactly only up to {tokens} tokens; "
            f"set --max-model-len {tokens} or less to run it"
        )


def _rope_parameter_sets(config: Any) -> list[dict[str, Any]]:
    """The config's rope parameters: one dict, or one per layer kind where they differ."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    nested = [value for value in params.values() if isinstance(value, dict)]
    return nested if nested else [params]


def _rope_types(config: Any) -> list[str]:
    return [str(p.get("rope_type", p.get("type", "default"))) for p in _rope_parameter_sets(config)]


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer can turn chat messages into a prompt: the one place that decides."""
    return bool(getattr(tokenizer, "chat_template", None))


def no_chat_template_message(model_name: str) -> str:
    """Why chat messages cannot run on this model: a job's refusal and a row's error alike."""
    return (
        f"model {model_name!r} has no chat template, so chat messages cannot be turned into "
        "a prompt; give plain-text prompts or use an instruct/chat model"
    )


def require_chat_template(loaded: LoadedModel) -> None:
    """Refuse chat-style input for a model whose tokenizer cannot format messages."""
    if not loaded.has_chat_template:
        raise UnsupportedModelError(no_chat_template_message(loaded.name))
