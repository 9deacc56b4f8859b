"""Which of a model's float32 linear layers may run decode steps' GEMMs transposed
(`transposed_gemm`): shapes whose transposed GEMM gives `F.linear`'s bits from a verified row
count on; whether it does is then timed on the job's own steps (`TransposedRoute`). Both
numerics: invariant layers keep their row schemes, and a fast engine's plain layers become
one-GEMM layers that do the same. The verdicts and routes live in the loaded model's probe
results, so each shape is checked and raced once per model, its layers sharing one route."""

from __future__ import annotations

from torch import nn

from astrai_batch.engine.numerics.transposed_gemm import (
    TransposedRoute,
    transposed_from,
    transposing_supported,
)
from astrai_batch.engine.runner.invariant_linear import (
    RowTiledLinear,
    plain_weights,
    whole_step_layers,
)


def transpose_weights(model: nn.Module, memo: dict) -> int:
    """Invariant numerics: every `RowTiledLinear` of `model` (neither narrow nor packed) of a
    verified shape gets its shape's route; returns how many."""
    layers = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, RowTiledLinear) and module._wide is None and module._packed is None
    ]
    routes = _routes(layers, memo)
    for name, module in layers:
        module._transposed = routes.get(name)
    return len(routes)


def transpose_plain_linears(model: nn.Module, memo: dict) -> int:
    """Fast numerics: each plain `nn.Linear` of a verified shape becomes a one-GEMM layer on
    its shape's route (`whole_step_layers`). Returns how many."""
    return whole_step_layers(model, lambda layers: _routes(layers, memo), "_transposed")


def _routes(layers: list[tuple[str, nn.Module]], memo: dict) -> dict[str, TransposedRoute]:
    """The route of each named layer that may run transposed: a plain weight of a dtype and
    device that transposes (`plain_weights`), a shape whose transposed GEMM gives F.linear's
    bits from some row count on."""
    verdicts = memo.setdefault(("transposed gemm",), {})
    routes = {}
    for name, _, key in plain_weights(layers, transposing_supported):
        if key not in verdicts:
            start = transposed_from(*key[:3])
            verdicts[key] = None if start is None else TransposedRoute(start)
        if verdicts[key] is not None:
            routes[name] = verdicts[key]
    return routes
