"""Which model architectures the engine can run correctly, decided from the config alone.

The engine plugs paged attention over a shared KV pool into transformers' attention interface.
That is only exact for plain causal self-attention over the whole context, so anything that changes
which keys a query sees (sliding windows, recurrent state, cross-attention) or how scores are
formed (logit softcapping) is refused here, before any weights are read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astrai_batch.errors import UnsupportedModelError

if TYPE_CHECKING:
    from astrai_batch.engine.loader import LoadedModel

# Decoder-only model types whose attention goes through transformers' attention interface
# with full causal attention, so the engine's paged attention can stand in for it.
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "gemma",
        "granite",
        "llama",
        "mistral",
        "olmo",
        "olmo2",
        "phi3",
        "qwen2",
        "qwen3",
        "smollm3",
    }
)

# Model types that keep recurrent or state-space state instead of (or next to) a KV cache.
RECURRENT_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "jamba",
        "lfm2",
        "lfm2_moe",
        "mamba",
        "mamba2",
        "minimax",
        "nemotron_h",
        "plamo2",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv",
        "xlstm",
        "zamba",
        "zamba2",
    }
)

_MULTIMODAL_SUBCONFIGS = ("vision_config", "text_config", "audio_config")


def describe_model(config: Any) -> str:
    """How messages name a model: its first listed architecture, else its model type."""
    architectures = getattr(config, "architectures", None)
    if architectures:
        return str(architectures[0])
    return f"model type {getattr(config, 'model_type', None)!r}"


def unsupported_reason(config: Any) -> str | None:
    """Why the engine cannot run this config, or None when it can.

    Specific reasons come before the allow-list so a refused model says what is wrong with it,
    not only that it is missing from the list.
    """
    model_type = getattr(config, "model_type", None)
    for name in _MULTIMODAL_SUBCONFIGS:
        if getattr(config, name, None) is not None:
            return f"it is multimodal (the config has a {name})"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    if model_type in RECURRENT_MODEL_TYPES:
        return "it is a hybrid, recurrent or state-space model"
    if getattr(config, "num_attention_heads", None) is None:
        return "it has no standard attention (no num_attention_heads)"
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        return f"it uses attention logit softcapping (attn_logit_softcapping={softcap})"
    window_reason = _sliding_window_reason(config)
    if window_reason is not None:
        return window_reason
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        return f"only these model types are supported: {supported}"
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(str(a).endswith("ForCausalLM") for a in architectures):
        listed = ", ".join(str(a) for a in architectures)
        return f"it has no causal-LM head (architectures: {listed})"
    return None


def _sliding_window_reason(config: Any) -> str | None:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        # Where the config lists per-layer attention kinds, those are what the model applies.
        others = sorted({kind for kind in layer_types if kind != "full_attention"})
        if others:
            return f"it has layers without full attention (layer_types: {', '.join(others)})"
    if getattr(config, "use_sliding_window", False):
        return "it uses sliding-window attention (use_sliding_window=True)"
    window = getattr(config, "sliding_window", None)
    max_positions = getattr(config, "max_position_embeddings", None)
    if not layer_types and window is not None and (max_positions is None or window < max_positions):
        return (
            f"it uses sliding-window attention (sliding_window={window} < "
            f"max_position_embeddings={max_positions})"
        )
    return None


def check_supported(config: Any) -> None:
    """Raise `UnsupportedModelError` naming the architecture and the reason, if unsupported."""
    reason = unsupported_reason(config)
    if reason is not None:
        raise UnsupportedModelError(f"{describe_model(config)} is not supported: {reason}")


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
