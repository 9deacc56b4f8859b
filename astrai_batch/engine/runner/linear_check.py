"""Refusing invariant numerics for linear layers that have no batch-invariant form.

`set_row_tiling` makes every plain `nn.Linear` invariant and leaves anything else alone. A
quantized layer (a subclass of `nn.Linear`, a library's own `...Linear` module, or a plain
`nn.Linear` whose weight is a tensor subclass such as torchao's `Int8Tensor`) runs its own
kernels, whose reduction order may follow the step's row count, so under invariant numerics
it would silently break the promise. Such a model is refused in invariant mode, naming the
first such layer and `--fast-numerics`; with fast numerics it runs as its library made it.

Mixture-of-experts layers are refused the same way: transformers stores each layer's experts
as stacked 3-D weights and multiplies each expert by the rows routed to it, so an expert's
GEMM has as many rows as the step routed there (and the router's own product is a bare
`F.linear`): a row's result would follow its batch. The start-up probe finds this too
(`invariance_probe`); this names the cause before anything runs.
"""

from __future__ import annotations

import re

import torch
from torch import nn

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
    """'name (class)' of the first mixture-of-experts layer (stacked 3-D expert weights)."""
    for name, module in model.named_modules():
        if any(p.dim() == 3 for p in module.parameters(recurse=False)):
            return f"{name} ({type(module).__name__})"
    return None


def refuse_variant_linears(model: nn.Module) -> None:
    experts = experts_layer(model)
    if experts is not None:
        raise ConfigError(
            f"mixture-of-experts layer {experts} multiplies each expert by the rows routed to "
            "it, so invariant numerics cannot hold; run with --fast-numerics (a row's output "
            "may then depend on its batch)"
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
