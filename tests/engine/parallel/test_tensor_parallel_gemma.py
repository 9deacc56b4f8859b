"""Tensor parallelism (two ranks, gloo on CPU) for Gemma 2 (softcapped attention and logits,
alternating windows, a query pre-attention scalar) and Gemma 3 (3 windowed layers : 1 global,
q/k norms): each rank holds 2 of 4 query heads and 1 of 2 KV heads, and windows, softcapping
and the scalar come from the config on every rank.

Prompts of 17-197 tokens: past several 16-token windows. Greedy tokens equal transformers
`generate`'s; a row alone equals the row in the crowd, bitwise (so the engines skip their
start-up probe, which checks the same thing, to keep the suite's time).
"""

from __future__ import annotations

import pytest
from engine.test_architectures_exact import CASES, save_tiny
from engine_reference import hf_greedy
from invariance_kit import assert_same_rows, capture_rows, invariance_prompts, requests_for

from astrai_batch.engine import EngineConfig, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model

CONFIG = EngineConfig(page_size=8, num_pages=96, max_num_batched_tokens=128)
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
ROWS = 4


@pytest.mark.parametrize("name", ["gemma2", "gemma3-text"])
def test_two_ranks_match_one_and_transformers_past_the_windows(name, tmp_path):
    model_type, overrides, _ = CASES[name]
    model_dir = save_tiny(tmp_path / name, model_type, overrides)
    sharded = load_model(model_dir, tensor_parallel_size=2, tp_timeout=60)
    try:
        assert sharded.model.model.layers[0].self_attn.q_proj.weight.shape == (32, 64)
        prompts = invariance_prompts(sharded.model.config.vocab_size, ROWS, seed=3)
        assert max(len(p) for p in prompts) > 3 * overrides["sliding_window"]
        crowd = capture_rows(
            EngineCore(sharded, CONFIG, invariance_probe=False),
            requests_for(prompts, range(ROWS), GREEDY),
        )
        alone = capture_rows(
            EngineCore(sharded, CONFIG, invariance_probe=False),
            requests_for(prompts, [0], GREEDY),
        )
    finally:
        sharded.close()
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    for rid in range(ROWS):
        assert list(crowd[rid][0]) == expected[rid], f"row {rid}: not transformers' tokens"
    assert_same_rows(alone, crowd, [0])
