"""Whether an adapter fits the base model: every module it targets exists, is a linear layer
we wrap, and has the adapter's shapes; its rank is within `--max-lora-rank`. Checked when the
job starts, before any row runs, one line per problem (the first found)."""

from __future__ import annotations

from torch import nn

from astrai_batch.engine.lora.adapter_files import AdapterFiles
from astrai_batch.errors import AdapterError

ANOTHER_BASE = "an adapter for another base model?"


def check_adapter(adapter: AdapterFiles, model: nn.Module, *, max_rank: int) -> None:
    name = adapter.name
    rank = adapter.config.rank
    if rank > max_rank:
        raise AdapterError(f"adapter {name!r} has rank {rank}, above --max-lora-rank {max_rank}")
    output = model.get_output_embeddings()
    for path, (a, b) in adapter.weights.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise AdapterError(
                f"adapter {name!r} targets {path}, which the model does not have ({ANOTHER_BASE})"
            ) from None
        base = getattr(module, "base", module)  # an installed LoraLinear wraps the layer
        if base is output:
            raise AdapterError(f"adapter {name!r} adapts the output layer {path}: not supported")
        if not _is_linear(base):
            raise AdapterError(
                f"adapter {name!r} targets {path}, a {type(base).__name__}; only linear "
                "layers are supported"
            )
        if a.shape[0] != rank:
            raise AdapterError(
                f"adapter {name!r}: {path} has rank {a.shape[0]}, the configuration says {rank}"
            )
        if a.shape[1] != base.in_features or b.shape[0] != base.out_features:
            raise AdapterError(
                f"adapter {name!r}: {path} maps {a.shape[1]} -> {b.shape[0]} features, the "
                f"model's layer {base.in_features} -> {base.out_features} ({ANOTHER_BASE})"
            )


def _is_linear(module: nn.Module) -> bool:
    """A plain linear layer, or the runner's row-tiled stand-in for one (same weight)."""
    if isinstance(module, nn.Linear):
        return type(module) is nn.Linear
    weight = getattr(module, "weight", None)
    return (
        isinstance(getattr(module, "in_features", None), int)
        and isinstance(weight, nn.Parameter)
        and tuple(weight.shape) == (module.out_features, module.in_features)
    )
