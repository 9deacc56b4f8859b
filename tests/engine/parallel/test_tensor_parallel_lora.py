"""LoRA adapters with tensor parallelism on CPU (gloo), two ranks, the tiny Llama and Qwen2.

Two adapters of different ranks on different layers (each touching both column- and
row-parallel layers), rows of the base and of each adapter mixed in every step: under the
default (invariant) numerics the greedy tokens of two ranks equal one process's and
transformers + PEFT `generate`'s; a row's logits on two ranks are bitwise the same alone and
in a crowd; each rank holds only its slices of the adapters.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_reference import mixed_prompts
from invariance_kit import assert_same_rows, capture_rows
from lora_kit import make_adapter, peft_greedy

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.lora.adapter_files import read_adapter
from astrai_batch.engine.lora.bank import install_adapters
from astrai_batch.engine.lora.lora_linear import LoraLinear
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.parallel.sharded_linear import RowParallelLinear

MAX_NEW = 8
CONFIG = EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=128)
# name -> (rank, seed, targets): q/v + down (colwise and rowwise), k + o + gate/up (the others)
ADAPTERS = {
    "a": (4, 11, ["q_proj", "v_proj", "down_proj"]),
    "b": (8, 12, ["k_proj", "o_proj", "gate_proj", "up_proj"]),
}
NAMES = [None, "a", "b"]


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tp-adapters-{tiny_model_dir.name}")
    return {
        name: make_adapter(tiny_model_dir, root / name, rank=rank, seed=seed, targets=targets)
        for name, (rank, seed, targets) in ADAPTERS.items()
    }


def _adapters(adapter_dirs):
    return [read_adapter(name, str(path)) for name, path in adapter_dirs.items()]


@pytest.fixture(scope="module")
def single(tiny_model_dir, adapter_dirs):
    loaded = load_model(tiny_model_dir)
    install_adapters(loaded.model, _adapters(adapter_dirs), max_rank=8)
    return loaded


@pytest.fixture(scope="module")
def sharded(tiny_model_dir, adapter_dirs):
    loaded = load_model(tiny_model_dir, tensor_parallel_size=2, tp_timeout=60)
    loaded.parallel.install_adapters(loaded.model, _adapters(adapter_dirs), max_rank=8)
    yield loaded
    loaded.close()


def _requests(prompts, ids):
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    return [GenerationRequest(i, prompts[i], params, adapter=NAMES[i % 3]) for i in ids]


def _run(loaded, requests, config=CONFIG):
    """{request id: (tokens, logits)} and the step count (no start-up probe: the rows'
    comparisons below are the check)."""
    core = EngineCore(loaded, config, invariance_probe=False)
    rows = capture_rows(core, requests)
    steps = core.stats().steps
    core.close()
    return rows, steps


@pytest.fixture(scope="module")
def prompts(single):
    return mixed_prompts(single.model.config.vocab_size, seed=21, count=9)


@pytest.fixture(scope="module")
def crowd(sharded, prompts):
    """Every row on two ranks in one run: the base's and both adapters' rows share steps."""
    rows, steps = _run(sharded, _requests(prompts, range(len(prompts))))
    assert steps < len(prompts) * MAX_NEW
    return rows


def test_rank_zero_holds_its_slices_of_each_adapter(single, sharded):
    whole, mine = single.model.model.layers[0], sharded.model.model.layers[0]
    q_whole, q_mine = whole.self_attn.q_proj, mine.self_attn.q_proj  # colwise: B's rows
    assert isinstance(q_mine, LoraLinear) and q_mine.b_all.shape == (3, 4, 32)
    assert torch.equal(q_mine.a_all, q_whole.a_all)
    assert torch.equal(q_mine.b_all, q_whole.b_all[:, :, :32])
    k_whole, k_mine = whole.self_attn.k_proj, mine.self_attn.k_proj  # 1 of 2 KV heads
    assert torch.equal(k_mine.b_all, k_whole.b_all[:, :, :16])
    down = mine.mlp.down_proj  # rowwise: A's columns, B whole, around the partial product
    assert isinstance(down, RowParallelLinear) and isinstance(down.partial, LoraLinear)
    assert torch.equal(down.partial.a_all, whole.mlp.down_proj.a_all[:, :64])
    assert torch.equal(down.partial.b_all, whole.mlp.down_proj.b_all)
    assert down.weight.shape == (64, 64)


def test_two_ranks_equal_one_process_and_peft(single, crowd, prompts, tiny_model_dir, adapter_dirs):
    one, _ = _run(single, _requests(prompts, range(len(prompts))))
    differs = 0
    for name in NAMES:
        rows = [i for i in range(len(prompts)) if NAMES[i % 3] == name]
        path = None if name is None else adapter_dirs[name]
        want = peft_greedy(tiny_model_dir, path, [prompts[i] for i in rows], MAX_NEW)
        for i, expected in zip(rows, want, strict=True):
            assert list(crowd[i][0]) == expected, f"row {i} (adapter {name}): not PEFT's tokens"
            assert one[i][0] == crowd[i][0], f"row {i} (adapter {name}): not one process's"
            for a, b in zip(one[i][1], crowd[i][1], strict=True):  # the halves' sum order
                assert (b - a).abs().max() <= 1e-5 * a.abs().max(), f"row {i}: logits"
        if name is not None:
            base = peft_greedy(tiny_model_dir, None, [prompts[i] for i in rows], MAX_NEW)
            differs += sum(b != w for b, w in zip(base, want, strict=True))
    assert differs >= 4  # the adapters change the rows: the comparison tests them


def test_fast_numerics_on_two_ranks_give_the_same_tokens(sharded, crowd, prompts):
    """--fast-numerics: one GEMM pair per adapter segment on each rank, one all-reduce."""
    fast = dataclasses.replace(CONFIG, numerics="fast")
    rows, _ = _run(sharded, _requests(prompts, range(len(prompts))), fast)
    assert {i: tokens for i, (tokens, _) in rows.items()} == {
        i: tokens for i, (tokens, _) in crowd.items()
    }


def test_rows_with_adapters_are_batch_invariant_on_two_ranks(sharded, crowd, prompts):
    watched = (4, 8)  # adapter "a", adapter "b" (the base's rows: test_tensor_parallel)
    alone = {}
    for i in watched:
        alone.update(_run(sharded, _requests(prompts, [i]))[0])
    assert_same_rows(alone, crowd, watched)


def test_a_target_the_plan_keeps_whole_is_refused(tiny_llama_dir, tmp_path):
    """A model whose plan leaves down_proj whole on every rank: an adapter of it is refused
    in one line, before any rank holds a slice (no processes needed: the plan and a model)."""
    from astrai_batch.engine.parallel.shard_plan import shard_plan
    from astrai_batch.engine.parallel.sharded_adapters import shard_adapter
    from astrai_batch.errors import AdapterError

    path = make_adapter(tiny_llama_dir, tmp_path / "down", rank=4, seed=1, targets=["down_proj"])
    adapter = read_adapter("down", str(path))
    loaded = load_model(tiny_llama_dir)
    config = loaded.model.config
    planned = dict(config.base_model_tp_plan)
    del planned["layers.*.mlp.down_proj"]
    config.base_model_tp_plan = planned
    plan = shard_plan(config, 2, model_name="tiny")
    with pytest.raises(AdapterError) as refused:
        shard_adapter(adapter, loaded.model, plan, 0)
    assert str(refused.value) == (
        "adapter 'down' targets model.layers.0.mlp.down_proj, which this model's "
        "tensor-parallel plan keeps whole on every rank; with --tensor-parallel-size > 1 an "
        "adapter may target only the plan's colwise and rowwise layers; run it with "
        "--tensor-parallel-size 1"
    )
