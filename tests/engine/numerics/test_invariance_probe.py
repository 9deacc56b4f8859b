"""The start-up invariance probe: passes where a row's bits never depend on its batch, and
refuses in one line naming --fast-numerics where they do."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.invariance_probe import (
    PROBE_SEED,
    check_invariance_at_start,
    crowd_check,
    probe_prompts,
)
from astrai_batch.errors import NumericsUnavailableError

REFUSAL = (
    "invariant numerics do not hold here (cpu, float32): row 0's logits at generated "
    "position 0 changed in a crowd (token budget 512) in the start-up check; run with "
    "--fast-numerics to accept results that depend on the batch"
)


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture
def batch_dependent(loaded):
    """The final norm's output plus a share of the packed step's mean: a real operator whose
    rows mix, as a kernel with a batch-shaped reduction would."""

    def mix(_module, _args, out):
        return out + 1e-3 * out.mean(dim=1, keepdim=True)

    handle = loaded.model.model.norm.register_forward_hook(mix)
    passed = set(loaded.invariance_passed)
    loaded.invariance_passed.clear()  # verdicts of the model without the hook
    yield
    handle.remove()
    loaded.invariance_passed.clear()
    loaded.invariance_passed.update(passed)


def cores(loaded):
    """What the engine core passes the probe: a core per configuration, not probing."""
    return lambda config: EngineCore(loaded, config, invariance_probe=False)


def test_the_probe_passes_on_the_invariant_path(loaded) -> None:
    check_invariance_at_start(loaded, EngineConfig(), cores(loaded))
    check_invariance_at_start(
        loaded, EngineConfig(page_size=8, enable_prefix_cache=False), cores(loaded)
    )
    check_invariance_at_start(
        loaded, EngineConfig(kv_layout="contiguous", max_num_seqs=2), cores(loaded)
    )


def test_a_batch_dependent_operator_is_refused_in_one_line(loaded, batch_dependent) -> None:
    with pytest.raises(NumericsUnavailableError) as caught:
        check_invariance_at_start(loaded, EngineConfig(), cores(loaded))
    assert str(caught.value) == REFUSAL
    # the engine runs it when it loads, under invariant numerics only
    with pytest.raises(NumericsUnavailableError) as caught:
        EngineCore(loaded, EngineConfig(num_pages=64))
    assert str(caught.value) == REFUSAL
    EngineCore(loaded, EngineConfig(num_pages=64, numerics="fast")).close()
    EngineCore(loaded, EngineConfig(num_pages=64), invariance_probe=False).close()


def test_the_same_run_twice_is_never_a_difference(loaded, batch_dependent) -> None:
    """No false alarm: even a batch-dependent model gives the same bits for the same batch."""
    prompts = probe_prompts(loaded.model.config.vocab_size, PROBE_SEED, cap=200)
    config = EngineConfig(num_pages=128, max_num_seqs=len(prompts))
    watched = prompts[:3]  # the crowd runs every prompt given, the reference the watched
    assert (
        crowd_check(cores(loaded), watched, [0, 1, 2], [config], alone=config, max_tokens=3) is None
    )
    alone = dataclasses.replace(config, max_num_seqs=1)
    found = crowd_check(cores(loaded), prompts, [0, 1, 2], [config], alone=alone, max_tokens=3)
    assert found == "row 0's logits at generated position 0 changed in a crowd (token budget 1024)"


def test_probe_rows_fit_a_short_context() -> None:
    prompts = probe_prompts(100, PROBE_SEED, cap=20)
    assert [len(p) for p in prompts] == [7, 20, 20, 20, 20, 12]
    assert all(3 <= t < 100 for p in prompts for t in p)
    assert prompts[3][:20] == prompts[2][:20]  # the first filler shares the last probe row


def test_probe_is_deterministic() -> None:
    assert probe_prompts(384, PROBE_SEED, 1000) == probe_prompts(384, PROBE_SEED, 1000)
    assert torch.tensor(probe_prompts(384, PROBE_SEED, 1000)[0]).max() < 384


def test_a_passed_probe_is_not_run_again_for_the_same_model_and_configuration(loaded) -> None:
    made = []

    def cores(config):
        made.append(config)
        return EngineCore(loaded, config, invariance_probe=False)

    loaded.invariance_passed.clear()
    check_invariance_at_start(loaded, EngineConfig(page_size=8), cores)
    first = len(made)
    assert first == 3  # alone, then the two crowds
    check_invariance_at_start(loaded, EngineConfig(page_size=8), cores)
    assert len(made) == first
    check_invariance_at_start(loaded, EngineConfig(page_size=16), cores)  # another probe
    assert len(made) == 2 * first
