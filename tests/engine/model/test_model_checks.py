"""Configs the engine runs exactly only up to some context length: refused above it, with the
reason and the limit in one line, accepted at it; and the run-time guard behind the check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from conftest import build_tiny_tokenizer, tiny_config_kwargs

from astrai_batch.cache import KVPool
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.model.support import check_supported, exact_context_limit
from astrai_batch.engine.runner.model_runner import ModelRunner, ScheduledChunk
from astrai_batch.errors import ConfigError, ModelLoadError, UnsupportedModelError

LONGROPE_128K = transformers.Phi3Config(
    max_position_embeddings=131072,
    original_max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 48,
        "long_factor": [4.0] * 48,
    },
)
DYNAMIC = transformers.LlamaConfig(
    max_position_embeddings=2048,
    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
)


@pytest.mark.parametrize(
    ("config", "context", "limit", "message"),
    [
        (
            transformers.MistralConfig(),
            131072,
            4096,
            "model type 'mistral' is not supported with a context of 131072 tokens: it uses "
            "sliding-window attention (sliding_window=4096), so it runs exactly only up to "
            "4096 tokens; set --max-model-len 4096 or less to run it",
        ),
        (
            transformers.Phi3Config(sliding_window=2047, max_position_embeddings=4096),
            4096,
            2047,
            "model type 'phi3' is not supported with a context of 4096 tokens: it uses "
            "sliding-window attention (sliding_window=2047), so it runs exactly only up to "
            "2047 tokens; set --max-model-len 2047 or less to run it",
        ),
        (
            transformers.Qwen2Config(
                use_sliding_window=True, num_hidden_layers=4, max_window_layers=2
            ),
            32768,
            4096,
            "model type 'qwen2' is not supported with a context of 32768 tokens: it uses "
            "sliding-window attention (sliding_window=4096), so it runs exactly only up to "
            "4096 tokens; set --max-model-len 4096 or less to run it",
        ),
        (
            LONGROPE_128K,
            131072,
            4096,
            "model type 'phi3' is not supported with a context of 131072 tokens: it uses "
            "longrope scaling (original_max_position_embeddings=4096; its factors switch with "
            "the longest sequence in a batch), so it runs exactly only up to 4096 tokens; set "
            "--max-model-len 4096 or less to run it",
        ),
        (
            DYNAMIC,
            4096,
            2048,
            "model type 'llama' is not supported with a context of 4096 tokens: it uses "
            "dynamic rope scaling (max_position_embeddings=2048; it rescales with the longest "
            "sequence in a batch), so it runs exactly only up to 2048 tokens; set "
            "--max-model-len 2048 or less to run it",
        ),
    ],
    ids=["mistral-window", "phi3-window", "qwen2-sliding-layers", "phi3-longrope", "dynamic"],
)
def test_context_limited_configs_are_refused_above_the_limit_only(config, context, limit, message):
    assert exact_context_limit(config)[0] == limit
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config, max_model_len=context)
    assert str(err.value) == message
    check_supported(config, max_model_len=limit)
    check_supported(config)  # without a context only the architecture is checked


def test_plain_configs_have_no_context_limit():
    for config in (transformers.LlamaConfig(), transformers.Qwen2Config()):
        check_supported(config, max_model_len=2048)
    assert exact_context_limit(transformers.LlamaConfig()) is None
    assert exact_context_limit(transformers.Qwen3Config()) is None  # use_sliding_window=False


def test_unknown_rope_types_and_attention_kinds_are_refused():
    config = transformers.LlamaConfig()
    config.rope_parameters = {"rope_type": "su-custom", "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config)
    assert str(err.value) == (
        "model type 'llama' is not supported: it uses rope_type 'su-custom', which the engine "
        "does not know to be exact"
    )
    config = transformers.Qwen2Config(num_hidden_layers=2)
    config.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config)
    assert str(err.value) == (
        "model type 'qwen2' is not supported: it has layers without full or sliding-window "
        "attention (chunked_attention)"
    )


def save_config_and_tokenizer(path: Path, config, model_max_length: int | None = None) -> Path:
    """A model directory without weights: a check that refuses it never read any."""
    config.save_pretrained(path)
    tokenizer = build_tiny_tokenizer()
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    tokenizer.save_pretrained(path)
    return path


def mistral(window: int) -> transformers.MistralConfig:
    return transformers.MistralConfig(
        architectures=["MistralForCausalLM"],
        sliding_window=window,
        **tiny_config_kwargs(build_tiny_tokenizer()),
    )


def test_the_load_checks_the_context_it_will_run_at_before_reading_weights(tmp_path):
    model_dir = save_config_and_tokenizer(tmp_path / "m", mistral(300))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(model_dir)
    assert str(err.value) == (
        "MistralForCausalLM is not supported with a context of 1024 tokens: it uses "
        "sliding-window attention (sliding_window=300), so it runs exactly only up to 300 "
        "tokens; set --max-model-len 300 or less to run it"
    )
    # Within the window (a cap, or the tokenizer's own limit) the check passes and the load
    # goes on to the weights, which this directory lacks.
    with pytest.raises(ModelLoadError, match=r"^Could not load the weights of model "):
        load_model(model_dir, max_model_len=300)
    short = save_config_and_tokenizer(tmp_path / "short", mistral(300), model_max_length=256)
    with pytest.raises(ModelLoadError, match=r"^Could not load the weights of model "):
        load_model(short)
    with pytest.raises(ConfigError) as err:
        load_model(model_dir, max_model_len=0)
    assert str(err.value) == "max_model_len must be >= 1, got 0"


def test_the_attention_refuses_a_window_that_would_bind(tmp_path):
    # The load check keeps sequences within the window; the attention guards it anyway
    # instead of silently attending past the window.
    model_dir = tmp_path / "m"
    model = transformers.AutoModelForCausalLM.from_config(mistral(8), dtype=torch.float32)
    model.save_pretrained(model_dir)
    save_config_and_tokenizer(model_dir, model.config)
    loaded = load_model(model_dir, max_model_len=8)
    assert loaded.max_model_len == 8
    pool = KVPool(
        num_pages=4,
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    runner = ModelRunner(loaded.model, pool)
    runner.forward([ScheduledChunk(list(range(3, 11)), 0, [0, 1], wants_logits=True)])
    with pytest.raises(RuntimeError) as err:
        runner.forward([ScheduledChunk(list(range(3, 12)), 0, [0, 1, 2], wants_logits=True)])
    assert str(err.value) == (
        "a sliding window of 8 tokens would cut a 9-token sequence; the paged attention does "
        "not apply sliding windows"
    )
