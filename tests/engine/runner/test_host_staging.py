"""Every per-step host-to-device copy goes through the runner's one `HostStaging`: counted
here per step against what each kind of step needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner import invariant_plan

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


def copies_per_step(core: EngineCore, prompts: list[list[int]]) -> list[int]:
    for i, prompt in enumerate(prompts):
        assert core.add_request(GenerationRequest(i, prompt, PARAMS)) == []
    counts = []
    while core.num_unfinished:
        before = core.runner.staging.copies
        core.step()
        counts.append(core.runner.staging.copies - before)
    core.close()
    return counts


PROMPTS = [list(range(3, 8)), list(range(40, 60))]  # 5 and 20 tokens: no shared page


def test_invariant_steps_copy_what_they_need(loaded) -> None:
    core = EngineCore(loaded, EngineConfig(num_pages=32), invariance_probe=False)
    if core.runner.flash is None:
        pytest.skip("the flash kernel's probe fails here: the block attention runs (below)")
    # prefill: ids, positions, logit rows, write slots + 4 per flash call (query rows, page
    # tables, mask, output slots) x 2 chunks; decode: both decodes in one call (64 keys)
    assert copies_per_step(core, PROMPTS) == [12, 8, 8]


def test_invariant_steps_in_the_block_attention_copy_what_they_need(loaded, monkeypatch):
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda model, pool: None)
    loaded.probe_results.clear()
    core = EngineCore(loaded, EngineConfig(num_pages=32), invariance_probe=False)
    loaded.probe_results.clear()
    # prefill: ids, positions, logit rows, write slots + 3 per run (rows, table, key mask)
    # x 2 runs; decode: the 4 step columns + units' rows, page tables, key limits
    assert copies_per_step(core, PROMPTS) == [10, 7, 7]


def test_fast_steps_copy_what_they_need(loaded) -> None:
    config = EngineConfig(num_pages=32, numerics="fast")
    # prefill from position 0: the 4 step columns and write slots' one; decode: + the padded
    # group's token index, page tables and key mask
    assert copies_per_step(EngineCore(loaded, config), PROMPTS) == [4, 7, 7]


def test_a_bucketed_decode_step_is_one_copy(loaded) -> None:
    core = EngineCore(loaded, EngineConfig(num_pages=32), static_decode=True)
    assert copies_per_step(core, PROMPTS) == [10, 1, 1]


def test_cpu_staging_shares_host_memory_and_counts() -> None:
    staging = HostStaging("cpu")
    array = np.arange(4, dtype=np.int64)
    tensor = staging.array(array)
    assert tensor.data_ptr() == array.ctypes.data  # no copy on CPU
    assert torch.equal(staging.values([1, 0], torch.bool), torch.tensor([True, False]))
    target = torch.zeros(4, dtype=torch.long)
    staging.into(target, tensor)
    assert torch.equal(target, tensor) and staging.copies == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_staging_copies_from_pinned_memory() -> None:
    staging = HostStaging("cuda")
    out = staging.array(np.arange(6, dtype=np.int64))
    assert out.device.type == "cuda" and out.tolist() == list(range(6))
