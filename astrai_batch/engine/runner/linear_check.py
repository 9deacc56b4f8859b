"""Refusing invariant numerics for linear layers that have no batch-invariant form.

`set_row_tiling` makes every plain `nn.Linear` invariant and leaves anything else alone. A
quantized layer (a subclass of `nn.Linear`, a library's own `...Linear` module, or a plain
`nn.Linear` whose weight is a tensor subclass such as torchao's `Int8Tensor`) runs its own
kernels, whose reduction order may follow the step's row count, so under invariant numerics
it would silently break the promise. Such a model is refused in invariant mode, naming the
first such layer and `--fast-numerics`; with fast numerics it runs as its library made it.

Mixture-of-experts layers that transformers builds with its experts interface (stacked 3-D
expert weights beside a router) run invariant (`invariant_experts`); any other module with
3-D weights multiplies them its own way, so it is refused the same way, as is an experts
module whose router this engine cannot find. The start-up probe (`invariance_probe`) judges
the whole forward; this names the cause before anything runs.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from astrai_batch.engine.runner.invariant_experts import (
    InvariantExperts,
    is_experts,
    router_of,
)
from astrai_batch.errors import ConfigError

# our own layers, already invariant (row-tiled) or made of invariant parts
_OURS = ("RowTiledLinear", "RowParallelLinear")


def variant_linear(model: nn.Module) -> str | None:
    """'name (what)' of the first linear layer invariant numerics cannot cover, or None."""
    for name, module in model.named_modules():
        kind = type(module)
        if kind.__name__ in _OURS and kind.__module__.startswith("astrai_batch."):
            continue
        if kind is nn.Linear:
            weight = module.weight
            plain = type(weight) in (torch.Tensor, nn.Parameter) and (
                type(weight.data) is torch.Tensor
            )
            if not plain:
                return f"{name} (nn.Linear with {type(weight.data).__name__} weights)"
        elif isinstance(module, nn.Linear) or _foreign_leaf_linear(module):
            return f"{name} ({kind.__module__}.{kind.__name__})"
    return None


def experts_layer(model: nn.Module) -> str | None:
    """'name (class)' of the first module with 3-D weights that `invariant_experts` cannot run
    (not a transformers experts module, or one without a router it can find)."""
    parents = {
        f"{name}.{child_name}" if name else child_name: module
        for name, module in model.named_modules()
        for child_name, _ in module.named_children()
    }
    for name, module in model.named_modules():
        if isinstance(module, InvariantExperts):
            continue
        if not any(p.dim() == 3 for p in module.parameters(recurse=False)):
            continue
        if is_experts(module) and router_of(parents[name]) is not None:
            continue
        return f"{name} ({type(module).__name__})"
    return None


def refuse_variant_linears(model: nn.Module) -> None:
    experts = experts_layer(model)
    if experts is not None:
        raise ConfigError(
            f"layer {experts} multiplies stacked 3-D weights in a way the engine has no "
            "batch-invariant form for, so invariant numerics cannot hold; run with "
            "--fast-numerics (a row's output may then depend on its batch)"
        )
    found = variant_linear(model)
    if found is not None:
        raise ConfigError(
            f"layer {found} has no batch-invariant form, so invariant numerics cannot hold; "
            "run with --fast-numerics (a row's output may then depend on its batch)"
        )


def _foreign_leaf_linear(module: nn.Module) -> bool:
    """A library's own linear kernel (GPTQ's QuantLinear, AWQ's WQLinear_GEMM, HQQLinear ...):
    a module without children, named like a linear layer, holding tensors. A wrapper whose
    children do the products (PEFT's lora.Linear around plain nn.Linear layers) is not one:
    its children are tiled like any other."""
    if next(module.children(), None) is not None:
        return False
    if not re.search(r"Linear(_\w*)?$", type(module).__name__):
        return False
    return next(module.parameters(recurse=False), None) is not None or (
        next(module.buffers(recurse=False), None) is not None
    )
