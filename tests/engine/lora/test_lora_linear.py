"""A wrapped layer's output for a row is bitwise the same whatever else the step holds (fixed
tiles), equals PEFT's formula, and leaves base rows untouched."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from astrai_batch.engine.lora.bank import LORA_TILE_ROWS, LoraBank
from astrai_batch.engine.lora.lora_linear import LoraLinear, LoraPair
from astrai_batch.engine.lora.step_rows import group_rows
from astrai_batch.engine.runner.invariant_linear import set_row_tiling

IN, OUT = 64, 96
RANKS = [4, 16, None, 8]  # slot 1..4; slot 3's adapter leaves this layer alone


def make_layer(seed: int) -> LoraLinear:
    torch.manual_seed(seed)
    holder = nn.Sequential(nn.Linear(IN, OUT))
    set_row_tiling(holder, True)  # the runner's invariant base layer
    base = holder[0]
    pairs = [None] + [
        None if r is None else LoraPair(torch.randn(r, IN), torch.randn(OUT, r), 2.0 / r)
        for r in RANKS
    ]
    return LoraLinear(base, LoraBank([]), pairs)


def run(layer: LoraLinear, x: torch.Tensor, slots: list[int], invariant: bool) -> torch.Tensor:
    rows = group_rows(
        slots,
        [1] * len(slots),
        tile_rows=LORA_TILE_ROWS if invariant else None,
        device=torch.device("cpu"),
    )
    layer.bank.step_rows = rows
    try:
        with torch.inference_mode():
            return layer(x.unsqueeze(0))[0]
    finally:
        layer.bank.step_rows = None


@pytest.mark.parametrize("seed", range(6))
def test_row_output_does_not_depend_on_the_step(seed):
    rng = random.Random(seed)
    layer = make_layer(seed)
    watched = torch.randn(IN)
    want = {}
    for trial in range(12):
        size = rng.randint(1, 150)
        slots = [rng.randint(0, 4) for _ in range(size)]
        x = torch.randn(size, IN)
        where = rng.randrange(size)
        x[where] = watched
        slot = slots[where]
        got = run(layer, x, slots, invariant=True)[where]
        if slot in want:
            assert torch.equal(got, want[slot]), f"seed {seed} trial {trial} slot {slot}"
        want[slot] = got


def test_equals_peft_formula_and_base_rows_untouched():
    layer = make_layer(0)
    slots = [0, 1, 2, 3, 4, 1, 0, 2]
    x = torch.randn(len(slots), IN)
    with torch.inference_mode():
        base = layer.base(x)
    for invariant in (True, False):
        got = run(layer, x, slots, invariant)
        for i, slot in enumerate(slots):
            pair = layer.pairs[slot]
            if pair is None:
                assert torch.equal(got[i], base[i])
            else:
                a, b = pair.a_t.t(), pair.b_t.t()
                # PEFT: result + lora_B(lora_A(x)) * scaling
                want = (
                    base[i]
                    + nn.functional.linear(nn.functional.linear(x[i : i + 1], a), b)[0]
                    * pair.scaling
                )
                torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)


def test_no_adapter_rows_is_no_work():
    assert group_rows([0, 0], [3, 1], tile_rows=32, device=torch.device("cpu")) is None
