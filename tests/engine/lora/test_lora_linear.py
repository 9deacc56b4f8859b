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


class OneLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(IN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.mark.parametrize("rank, alpha", [(3, 16), (6, 7), (5, 1)])
def test_bf16_equals_peft_bitwise(rank, alpha):
    """Over a bf16 layer PEFT (its default autocast_adapter_dtype) keeps A and B in float32,
    computes `lora_B(lora_A(x)) * (alpha / r)` in float32 with the scale a Python float, adds
    it to the bf16 base output in float32 and rounds once. With weights and inputs of small
    integers every GEMM sum is exact, so both paths (tiled and not) must equal PEFT bit for
    bit; a scale rounded to bf16 (16 / 3 = 5.3333 -> 5.3125) or a delta rounded to bf16
    before the sum would not."""
    from peft import LoraConfig, get_peft_model

    generator = torch.Generator().manual_seed(rank)

    def small_ints(*shape):
        return torch.randint(-1, 2, shape, generator=generator).to(torch.bfloat16)

    reference = get_peft_model(
        OneLinear().to(torch.bfloat16),
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=["proj"]),
    )
    proj = reference.base_model.model.proj
    with torch.no_grad():
        proj.base_layer.weight.copy_(small_ints(OUT, IN))
        proj.base_layer.bias.copy_(small_ints(OUT))
        proj.lora_A["default"].weight.copy_(small_ints(rank, IN))
        proj.lora_B["default"].weight.copy_(small_ints(OUT, rank))
    assert proj.scaling["default"] == alpha / rank
    reference.eval()

    holder = nn.Sequential(nn.Linear(IN, OUT, dtype=torch.bfloat16))
    with torch.no_grad():
        holder[0].weight.copy_(proj.base_layer.weight)
        holder[0].bias.copy_(proj.base_layer.bias)
    set_row_tiling(holder, True)
    pair = LoraPair(
        proj.lora_A["default"].weight.detach().clone(),
        proj.lora_B["default"].weight.detach().clone(),
        alpha / rank,
    )
    layer = LoraLinear(holder[0], LoraBank([]), [None, pair])
    slots = [1, 0, 1, 1, 0, 1, 1]
    x = small_ints(len(slots), IN)
    with torch.inference_mode():
        want = reference(x)
        base = proj.base_layer(x)
    for invariant in (True, False):
        got = run(layer, x, slots, invariant)
        for i, slot in enumerate(slots):
            assert torch.equal(got[i], want[i] if slot else base[i]), (invariant, i)
