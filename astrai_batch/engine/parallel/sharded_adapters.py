"""A rank's shard of each LoRA adapter, split as the base layer it adapts is split.

A column-parallel layer (q/k/v, gate/up) holds a slice of the output features: its adapter's
B keeps the same rows (the same KV head where KV heads are replicated), A is whole, so the
rank's delta is the rank's slice of the whole delta. A row-parallel layer (o, down) holds a
slice of the input features: its adapter's A keeps the same columns, B is whole, and the
adapter wraps the layer's partial product (`RowParallelLinear.partial`): the rank's partial
delta joins the base's partial before the sum over ranks, which adds them in rank order as
it adds the base's alone. A target the plan keeps whole on every rank, or splits some other
way (the LM head over the vocabulary), is refused: one line naming the module.

Every rank reads the adapter's files itself (from the path or URI the job was given) and keeps
only its slices; a rank whose files differ from rank 0's (changed while the job started)
refuses them, so every rank runs the same adapter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torch import nn

from astrai_batch.engine.lora.adapter_checks import ANOTHER_BASE
from astrai_batch.engine.lora.adapter_files import AdapterFiles, read_adapter
from astrai_batch.engine.parallel.shard_plan import COLWISE, ShardPlan
from astrai_batch.engine.parallel.sharded_linear import PARTIAL, RowParallelLinear
from astrai_batch.engine.parallel.sharded_load import FULL_OUT, colwise_rows
from astrai_batch.errors import AdapterError


def shard_adapter(
    adapter: AdapterFiles, model: nn.Module, plan: ShardPlan, rank: int
) -> AdapterFiles:
    """`adapter` as rank `rank` of `plan` holds it in `model` (that rank's shard): each target's
    A and B sliced as its layer is, a row-parallel target renamed to the layer's partial
    product. Targets the model lacks are passed on whole (`check_adapter` names them)."""
    prefix = model.base_model_prefix + "."
    output = model.get_output_embeddings()
    weights = {}
    for path, (a, b) in adapter.weights.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:
            weights[path] = (a, b)
            continue
        if isinstance(module, RowParallelLinear):
            _check_features(adapter, path, a, b, module.in_features, module.out_features)
            share = module.in_features // plan.world_size
            columns = a[:, rank * share : (rank + 1) * share].contiguous()
            weights[f"{path}.{PARTIAL}"] = (columns, b)
            continue
        style = plan.style(path[len(prefix) :]) if path.startswith(prefix) else None
        if style == COLWISE and type(module) is nn.Linear:
            full_out = getattr(module, FULL_OUT, module.out_features)
            _check_features(adapter, path, a, b, module.in_features, full_out)
            first, last = colwise_rows(path, full_out, plan, rank)
            weights[path] = (a, b[first:last].contiguous())
            continue
        if module is output:
            weights[path] = (a, b)  # `check_adapter`: the output layer is never adapted
            continue
        how = "keeps whole on every rank" if style is None else f"splits as {style}"
        raise AdapterError(
            f"adapter {adapter.name!r} targets {path}, which this model's tensor-parallel plan "
            f"{how}; with --tensor-parallel-size > 1 an adapter may target only the plan's "
            "colwise and rowwise layers; run it with --tensor-parallel-size 1"
        )
    return dataclasses.replace(adapter, weights=weights)


def _check_features(adapter, path, a, b, in_features: int, out_features: int) -> None:
    """The whole layer's shapes, before slicing (after it, `check_adapter` would name the
    rank's slice sizes, not the model's)."""
    if a.shape[1] != in_features or b.shape[0] != out_features:
        raise AdapterError(
            f"adapter {adapter.name!r}: {path} maps {a.shape[1]} -> {b.shape[0]} features, the "
            f"model's layer {in_features} -> {out_features} ({ANOTHER_BASE})"
        )


def install_sharded(
    model: nn.Module,
    adapters: Sequence[AdapterFiles],
    plan: ShardPlan,
    rank: int,
    *,
    max_rank: int,
) -> None:
    """Slices every adapter for this rank and installs the slices (`lora.bank`)."""
    from astrai_batch.engine.lora.bank import install_adapters

    shards = [shard_adapter(adapter, model, plan, rank) for adapter in adapters]
    install_adapters(model, shards, max_rank=max_rank)


def read_as_rank_zero(specs: Sequence[tuple[str, str, str]]) -> list[AdapterFiles]:
    """A worker's adapters from (name, path, rank 0's digest): read from the same paths and
    refused where the files are no longer the ones rank 0 read."""
    adapters = []
    for name, path, digest in specs:
        adapter = read_adapter(name, path)
        if adapter.digest != digest:
            raise AdapterError(
                f"adapter {name!r} at {path} changed while the job started (its files differ "
                "from the ones rank 0 read)"
            )
        adapters.append(adapter)
    return adapters
