"""Where adapter weights live while a model serves: each target layer is wrapped once by a
`LoraLinear` holding every adapter's matrices for that layer (on the layer's device; float32
over a bf16 or fp16 layer, as PEFT keeps them, else the layer's dtype), and all wrappers share
one `LoraBank`: the adapters' names and slots, and the current step's row grouping, which the
runner sets before each forward and clears after it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from astrai_batch.engine.lora.adapter_checks import check_adapter
from astrai_batch.engine.lora.adapter_files import AdapterFiles
from astrai_batch.engine.lora.lora_linear import LoraLinear, LoraPair, adapter_dtype
from astrai_batch.engine.lora.step_rows import StepAdapterRows, group_rows
from astrai_batch.errors import AdapterError

# Rows per GEMM of an adapter's delta under invariant numerics; a rank-r delta is small next to
# the base layer's GEMM, so a small tile wastes little on padding when few rows use an adapter.
LORA_TILE_ROWS = 32


class LoraBank:
    """The adapters installed in one model. Slot i + 1 is `adapters[i]`; slot 0 the base."""

    def __init__(self, adapters: Sequence[AdapterFiles]) -> None:
        self.adapters = tuple(adapters)
        self.slots = {adapter.name: i + 1 for i, adapter in enumerate(self.adapters)}
        self.step_rows: StepAdapterRows | None = None
        self.nbytes = 0  # of the matrices on the model's device

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(adapter.name for adapter in self.adapters)

    def slot(self, name: str | None) -> int | None:
        """The slot of adapter `name` (0 for None: the base model); None when unknown."""
        if name is None:
            return 0
        return self.slots.get(name)

    def begin_step(
        self,
        chunk_slots: Sequence[int],
        chunk_tokens: Sequence[int],
        *,
        invariant: bool,
        device: torch.device,
    ) -> None:
        self.step_rows = group_rows(
            chunk_slots,
            chunk_tokens,
            tile_rows=LORA_TILE_ROWS if invariant else None,
            device=device,
        )

    def end_step(self) -> None:
        self.step_rows = None


def install_adapters(
    model: nn.Module, adapters: Sequence[AdapterFiles], *, max_rank: int
) -> LoraBank:
    """Checks every adapter against `model` and wraps the layers they target; the model must
    carry no adapters yet (`remove_adapters` first)."""
    if find_bank(model) is not None:
        raise AdapterError("the model already has LoRA adapters installed")
    names = [adapter.name for adapter in adapters]
    if len(set(names)) != len(names):
        raise AdapterError(f"LoRA adapter names repeat: {', '.join(names)}")
    for adapter in adapters:
        check_adapter(adapter, model, max_rank=max_rank)
    bank = LoraBank(adapters)
    targets = sorted({path for adapter in adapters for path in adapter.weights})
    for path in targets:
        base = model.get_submodule(path)
        weight = base.weight
        pairs: list[LoraPair | None] = [None]
        for adapter in adapters:
            found = adapter.weights.get(path)
            if found is None:
                pairs.append(None)
                continue
            dtype = adapter_dtype(weight.dtype)  # float32 over a half-precision layer
            a, b = (t.to(device=weight.device, dtype=dtype) for t in found)
            pairs.append(LoraPair(a, b, adapter.config.scaling))
        layer = LoraLinear(base, bank, pairs)
        bank.nbytes += layer.a_all.nbytes + layer.b_all.nbytes
        model.set_submodule(path, layer)
    return bank


def find_bank(model: nn.Module) -> LoraBank | None:
    for module in model.modules():
        if isinstance(module, LoraLinear):
            return module.bank
    return None


def remove_adapters(model: nn.Module) -> int:
    """Puts every wrapped layer back; returns how many were unwrapped."""
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLinear)]
    for name, module in wrapped:
        model.set_submodule(name, module.base)
    return len(wrapped)
