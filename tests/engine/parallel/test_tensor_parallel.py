"""Tensor parallelism on CPU (gloo), two ranks, the tiny models (4 query heads, 2 KV heads).

Against the same model on one rank: greedy tokens identical, logits within 1e-5 of the
row's largest logit (the row-parallel layers add their halves in another order, so the last
bits may differ). Within two ranks,
a row's logits are bitwise the same alone and in a crowd (batch invariance survives the
sharding: every rank's GEMMs are row-tiled, partial sums are added in rank order).
"""

from __future__ import annotations

import pytest
import torch
from invariance_kit import assert_same_rows, invariance_prompts, requests_for, run_capturing

from astrai_batch.engine import EngineConfig, SamplingParams
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.parallel.sharded_linear import RowParallelLinear
from astrai_batch.engine.parallel.vocab_head import VocabParallelHead

CONFIG = EngineConfig(page_size=8, num_pages=96, max_num_batched_tokens=128)
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=8, temperature=0.8, ignore_eos=True)


@pytest.fixture(scope="module")
def single(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def sharded(tiny_model_dir):
    loaded = load_model(tiny_model_dir, tensor_parallel_size=2, tp_timeout=60)
    yield loaded
    loaded.close()


def test_rank_zero_holds_its_shard_only(single, sharded):
    full = single.model.model.layers[0]
    mine = sharded.model.model.layers[0]
    assert mine.self_attn.q_proj.weight.shape == (32, 64)  # 2 of 4 query heads
    assert mine.self_attn.k_proj.weight.shape == (16, 64)  # 1 of 2 KV heads
    assert isinstance(mine.self_attn.o_proj, RowParallelLinear)
    assert mine.self_attn.o_proj.weight.shape == (64, 32)
    assert mine.mlp.down_proj.weight.shape == (64, 64)
    assert torch.equal(mine.self_attn.q_proj.weight, full.self_attn.q_proj.weight[:32])
    assert torch.equal(mine.mlp.down_proj.weight, full.mlp.down_proj.weight[:, :64])
    if full.self_attn.q_proj.bias is not None:  # Qwen2: the q/k/v biases are split too
        assert torch.equal(mine.self_attn.k_proj.bias, full.self_attn.k_proj.bias[:16])
    assert sharded.num_kv_heads == 1 and single.num_kv_heads == 2
    head = sharded.model.lm_head  # split over the vocabulary, as the model class's plan says
    assert isinstance(head, VocabParallelHead) and head.weight.shape == (192, 64)
    assert torch.equal(head.weight, single.model.lm_head.weight[:192])


def test_two_ranks_match_one(single, sharded):
    prompts = invariance_prompts(single.model.config.vocab_size, 6, seed=3)
    requests = requests_for(prompts, range(6), GREEDY)
    one, _ = run_capturing(single, requests, CONFIG)
    two, stats = run_capturing(sharded, requests, CONFIG)
    assert stats.steps > 1
    for rid in range(6):
        assert one[rid][0] == two[rid][0], f"row {rid}: greedy tokens differ"
        for a, b in zip(one[rid][1], two[rid][1], strict=True):
            assert (b - a).abs().max() <= 1e-5 * a.abs().max(), f"row {rid}: logits differ"


def test_batch_invariance_within_two_ranks(sharded):
    prompts = invariance_prompts(sharded.model.config.vocab_size, 10, seed=8)
    watched = (0, 3, 7)

    def params(i):
        return SAMPLED if i % 2 else GREEDY

    alone = {}
    for i in watched:
        got, _ = run_capturing(sharded, requests_for(prompts, [i], params(i)), CONFIG)
        alone.update(got)
    crowd_requests = [r for i in range(10) for r in requests_for(prompts, [i], params(i))]
    crowd, stats = run_capturing(sharded, crowd_requests, CONFIG)
    assert stats.steps < 10 * GREEDY.max_tokens  # the rows ran together, not one by one
    assert_same_rows(alone, crowd, watched)


def test_each_rank_plans_attention_rows_from_its_own_query_heads(single, sharded, monkeypatch):
    """2 of 4 query heads over 1 of 2 KV heads: a group of 2 query rows per key, as on one
    rank (not the model's 4 heads over the rank's 1 KV head); the block attention's GEMM
    probe is sized from the same group."""
    from astrai_batch.engine.core import EngineCore
    from astrai_batch.engine.runner import invariant_plan

    for loaded in (single, sharded):
        core = EngineCore(loaded, CONFIG, invariance_probe=False)
        assert core.runner.flash is None or core.runner.flash.group == 2
        core.close()
    seen = []
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda heads, pool: None)
    real = invariant_plan.attention_row_scheme

    def spy(head_dim, value_dim, block, max_rows, device, dtype):
        seen.append(max_rows)
        return real(head_dim, value_dim, block, max_rows, device, dtype)

    monkeypatch.setattr(invariant_plan, "attention_row_scheme", spy)
    sharded.probe_results.clear()
    single.probe_results.clear()
    EngineCore(sharded, CONFIG, invariance_probe=False).close()
    EngineCore(single, CONFIG, invariance_probe=False).close()
    assert len(seen) == 2 and seen[0] == seen[1], seen
