"""Three ranks on the real SmolLM2-135M (9 query heads, 3 KV heads: one KV head per rank),
gloo on CPU: greedy tokens equal one rank's, logits within 1e-5 of the row's largest logit
(slow: real weights, three processes)."""

from __future__ import annotations

import pytest
from invariance_kit import requests_for, run_capturing

from astrai_batch.engine import EngineConfig, SamplingParams
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.parallel.vocab_head import VocabParallelHead

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "How many legs does a spider have?",
]


@pytest.mark.long
def test_three_ranks_match_one_on_smollm2():
    single = load_model("smollm2-135m")
    tokenizer = single.tokenizer
    prompts = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    config = EngineConfig(page_size=16, num_pages=48, max_num_batched_tokens=64)
    requests = requests_for(prompts, range(len(prompts)), SamplingParams(max_tokens=6))
    one, _ = run_capturing(single, requests, config)
    sharded = load_model("smollm2-135m", tensor_parallel_size=3, tp_timeout=120)
    try:
        assert sharded.num_kv_heads == 1
        # the tied head: a third of the vocabulary, a view of the embedding's rows
        head = sharded.model.lm_head
        embedding = sharded.model.get_input_embeddings().weight
        assert isinstance(head, VocabParallelHead) and head.weight.shape == (16384, 576)
        assert head.weight.data_ptr() == embedding.data_ptr()
        three, _ = run_capturing(sharded, requests, config)
    finally:
        sharded.close()
    for rid in range(len(prompts)):
        assert one[rid][0] == three[rid][0], f"row {rid}: greedy tokens differ"
        for a, b in zip(one[rid][1], three[rid][1], strict=True):
            assert (b - a).abs().max() <= 1e-5 * a.abs().max(), f"row {rid}: logits differ"
