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
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
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
    ids=["phi3-longrope", "dynamic"],
)
def test_context_limited_configs_are_refused_above_the_limit_only(config, context, limit, message):
    assert exact_context_limit(config)[0] == limit
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config, max_model_len=context)
    assert str(err.value) == message
    check_supported(config, max_model_len=limit)
    check_supported(config)  # without a context only the architecture is checked


def test_plain_and_windowed_configs_have_no_context_limit():
    windowed = (
        transformers.MistralConfig(),
        transformers.Phi3Config(sliding_window=2047, max_position_embeddings=4096),
        transformers.Qwen2Config(use_sliding_window=True, num_hidden_layers=4, max_window_layers=2),
        transformers.Gemma3TextConfig(),
    )
    for config in (transformers.LlamaConfig(), transformers.Qwen2Config(), *windowed):
        check_supported(config, max_model_len=131072)
        assert exact_context_limit(config) is None
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
    config = transformers.Phi3Config(
        architectures=["Phi3ForCausalLM"],
        **{
            **tiny_config_kwargs(build_tiny_tokenizer()),
            "original_max_position_embeddings": 300,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
            },
        },
    )
    model_dir = save_config_and_tokenizer(tmp_path / "m", config)
    with pytest.raises(UnsupportedModelError) as err:
        load_model(model_dir)
    assert str(err.value) == (
        "Phi3ForCausalLM is not supported with a context of 1024 tokens: it uses longrope "
        "scaling (original_max_position_embeddings=300; its factors switch with the longest "
        "sequence in a batch), so it runs exactly only up to 300 tokens; set --max-model-len "
        "300 or less to run it"
    )
    # Within the limit (a cap, or the tokenizer's own limit) the check passes and the load
    # goes on to the weights, which this directory lacks.
    with pytest.raises(ModelLoadError, match=r"^Could not load the weights of model "):
        load_model(model_dir, max_model_len=300)
    short = save_config_and_tokenizer(tmp_path / "short", config, model_max_length=256)
    with pytest.raises(ModelLoadError, match=r"^Could not load the weights of model "):
        load_model(short)
    with pytest.raises(ConfigError) as err:
        load_model(model_dir, max_model_len=0)
    assert str(err.value) == "max_model_len must be >= 1, got 0"


def test_a_window_binds_past_its_length_in_one_forward(tmp_path):
    """A 40-token sequence through a window of 8, as one prefill chunk: every position's
    logits are transformers' (its own sliding-window mask) to float rounding."""
    model_dir = tmp_path / "m"
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(mistral(8), dtype=torch.float32)
    model.save_pretrained(model_dir)
    save_config_and_tokenizer(model_dir, model.config)
    loaded = load_model(model_dir)
    assert loaded.max_model_len == 1024
    pool = KVPool(
        num_pages=12,
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    runner = ModelRunner(loaded.model, pool)
    tokens = [3 + (7 * i) % 50 for i in range(40)]
    out = runner.forward(
        [ScheduledChunk(tokens, 0, list(range(10)), wants_logits=True, logit_span=(0, 39))]
    )
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        want = reference(torch.tensor([tokens])).logits[0]
    # the sampling row (position 39) first, then positions 0..38
    got = torch.cat([out.logits[1:], out.logits[:1]])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():  # and the window does bind: full attention differs
        full = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, sliding_window=None
        )(torch.tensor([tokens])).logits[0]
    assert not torch.allclose(full[8:], want[8:], atol=1e-3)
