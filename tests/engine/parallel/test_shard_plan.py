"""The plan a model is split by: replicated layers accepted (Qwen3's per-head norms), styles we
do not run refused in one line; and a two-rank tiny Qwen3 (q/k norms replicated, its head tied
to the embedding and split over the vocabulary) against one rank."""

from __future__ import annotations

import pytest
import torch
from invariance_kit import invariance_prompts, requests_for, run_capturing
from transformers import AutoConfig, Qwen3Config, Qwen3MoeConfig

from astrai_batch.engine import EngineConfig, SamplingParams
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.parallel.shard_plan import COLWISE, ROWWISE, shard_plan
from astrai_batch.engine.parallel.vocab_head import VocabParallelHead
from astrai_batch.errors import ConfigError


def qwen3_config(**overrides):
    shape = dict(
        vocab_size=101,  # odd: the vocabulary does not split evenly over two ranks
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        initializer_range=0.3,
    )
    return Qwen3Config(**{**shape, **overrides})


def test_replicated_layers_are_whole_on_every_rank():
    plan = shard_plan(qwen3_config(), 2, model_name="q")
    assert plan.style("layers.0.self_attn.q_norm") is None
    assert plan.style("layers.1.self_attn.q_proj") == COLWISE
    assert plan.style("layers.1.mlp.down_proj") == ROWWISE


def test_a_style_we_do_not_run_is_refused_in_one_line():
    config = qwen3_config()
    config.base_model_tp_plan = {**config.base_model_tp_plan, "layers.*.mlp.experts": "ep_router"}
    with pytest.raises(ConfigError) as refused:
        shard_plan(config, 2, model_name="q")
    assert str(refused.value) == (
        "model 'q': its tensor-parallel plan uses ep_router; only colwise, rowwise and "
        "replicated layers are supported; run it with --tensor-parallel-size 1"
    )


@pytest.fixture(scope="module")
def tiny_qwen3_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("tiny-qwen3")
    torch.manual_seed(77)
    AutoModelForCausalLM.from_config(qwen3_config(), dtype=torch.float32).save_pretrained(path)
    return path


def test_two_ranks_of_a_tied_qwen3_match_one(tiny_qwen3_dir):
    single = load_model(tiny_qwen3_dir)
    sharded = load_model(tiny_qwen3_dir, tensor_parallel_size=2, tp_timeout=60)
    try:
        head = sharded.model.lm_head
        embedding = sharded.model.get_input_embeddings().weight
        assert isinstance(head, VocabParallelHead) and head.weight.shape == (51, 64)
        assert head.weight.data_ptr() == embedding.data_ptr()  # tied: the embedding's rows
        prompts = invariance_prompts(101, 4, seed=2)
        requests = requests_for(prompts, range(4), SamplingParams(max_tokens=6, ignore_eos=True))
        config = EngineConfig(page_size=8, num_pages=64, max_num_batched_tokens=64)
        one, _ = run_capturing(single, requests, config)
        two, _ = run_capturing(sharded, requests, config)
    finally:
        sharded.close()
    for rid in range(4):
        assert one[rid][0] == two[rid][0], f"row {rid}: greedy tokens differ"
        for a, b in zip(one[rid][1], two[rid][1], strict=True):
            assert b.shape == (101,)
            assert (b - a).abs().max() <= 1e-5 * a.abs().max(), f"row {rid}: logits differ"


def test_a_mixture_of_experts_model_is_refused_in_one_line():
    config = Qwen3MoeConfig(num_experts=8)
    with pytest.raises(ConfigError) as caught:
        shard_plan(config, 2, model_name="m")
    assert str(caught.value) == (
        "model 'm' is a mixture-of-experts model (num_experts=8); tensor parallelism does not "
        "split expert layers yet; run it with --tensor-parallel-size 1"
    )


def test_a_latent_attention_model_is_refused_in_one_line():
    """Dense DeepSeek V3 (no routed experts): its latent pages are not split across ranks."""
    config = AutoConfig.for_model("deepseek_v3", n_routed_experts=0, kv_lora_rank=32)
    with pytest.raises(ConfigError) as caught:
        shard_plan(config, 2, model_name="m")
    assert str(caught.value) == (
        "model 'm' uses multi-head latent attention (kv_lora_rank=32); tensor parallelism does "
        "not split latent pages yet; run it with --tensor-parallel-size 1"
    )
