"""Per-row adapters on the real SmolLM2-135M equal transformers + PEFT (slow: real weights)."""

from __future__ import annotations

import pytest
from lora_kit import make_adapter, peft_greedy

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.lora.adapter_files import read_adapter
from astrai_batch.engine.lora.bank import install_adapters, remove_adapters
from astrai_batch.engine.model.loader import load_model

pytestmark = pytest.mark.slow

SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What do bees make?",
    "How many legs does a spider have?",
    "Which planet is known as the red planet?",
    "What is two plus two?",
]


def test_smollm2_adapters_match_peft(tmp_path):
    loaded = load_model("smollm2-135m")
    source = loaded.source
    paths = {
        "r4": make_adapter(source, tmp_path / "r4", rank=4, seed=1, scale=0.02),
        "r16": make_adapter(source, tmp_path / "r16", rank=16, seed=2, scale=0.02),
    }
    adapters = [read_adapter(name, str(path)) for name, path in paths.items()]
    install_adapters(loaded.model, adapters, max_rank=16)
    try:
        tokenizer = loaded.tokenizer
        prompts = []
        for question in QUESTIONS:
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        names = [None, "r4", "r16"]
        params = SamplingParams(max_tokens=16)
        requests = [
            GenerationRequest(i, p, params, adapter=names[i % 3]) for i, p in enumerate(prompts)
        ]
        config = EngineConfig(page_size=16, num_pages=128, max_num_batched_tokens=64)
        results, _ = generate_sync(loaded, requests, config)
    finally:
        remove_adapters(loaded.model)
    for name in names:
        rows = [i for i in range(len(prompts)) if names[i % 3] == name]
        path = None if name is None else paths[name]
        want = peft_greedy(source, path, [prompts[i] for i in rows], 16)
        assert [list(results[i].token_ids) for i in rows] == want, name
