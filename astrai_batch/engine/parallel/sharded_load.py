"""A rank's shard of a model, read slice by slice from the checkpoint's safetensors files.

The model is built with its parameters on the meta device (buffers such as RoPE's inverse
frequencies are real: they are computed, not loaded), the plan's linear layers are replaced
by their rank-local forms, and every parameter is then read as the slice this rank needs
(`safe_open(...).get_slice`), so no rank ever holds the whole model's layers. Embeddings
and norms are read whole; the LM head's vocabulary rows are split (`vocab_head`), read from
the embedding's rows where the head is tied to it and the checkpoint stores it once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai_batch.engine.parallel.rank_group import RankGroup
from astrai_batch.engine.parallel.shard_plan import COLWISE, ROWWISE, VOCAB, ShardPlan
from astrai_batch.engine.parallel.sharded_linear import RowParallelLinear
from astrai_batch.engine.parallel.vocab_head import CHILD, VocabParallelHead, vocab_rows
from astrai_batch.errors import ConfigError, ModelLoadError

# a column-parallel layer's output features in the whole model (its own are the rank's slice)
FULL_OUT = "full_out_features"


def safetensors_index(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it; ModelLoadError when the model has no safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise ModelLoadError(
            f"tensor parallelism reads safetensors checkpoints; {model_dir} has none "
            "(model.safetensors or model.safetensors.index.json)"
        )
    from safetensors import safe_open

    with safe_open(single, framework="pt") as handle:
        return {name: single for name in handle.keys()}  # noqa: SIM118 (not iterable)


def load_shard(
    model_dir: Path,
    config: Any,
    *,
    plan: ShardPlan,
    group: RankGroup,
    dtype: torch.dtype,
    trust_remote_code: bool,
) -> nn.Module:
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, GenerationConfig

    model_dir = Path(model_dir)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    # tied weights (an LM head that is the embedding, as SmolLM2's) share one parameter, read
    # once: from_config on the meta device leaves them apart until asked
    model.tie_weights()
    styles = _shard_layers(model, plan, group, dtype)
    head, tied = _split_head(model, group, dtype)
    if head is not None:
        styles[head] = VOCAB
    skip = {f"{head}.weight"} if tied else set()  # rows of the embedding, viewed once read
    _read_parameters(model, safetensors_index(model_dir), styles, plan, group, dtype, skip)
    if tied:
        local = model.get_submodule(head)
        embedding = model.get_input_embeddings().weight
        local.vocab_rows.weight = nn.Parameter(
            embedding[local.first : local.last], requires_grad=False
        )
    model.to(group.device)  # the computed buffers; parameters are there already
    if (model_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    model.eval()
    model.requires_grad_(False)
    return model


def _shard_layers(
    model: nn.Module, plan: ShardPlan, group: RankGroup, dtype: torch.dtype
) -> dict[str, str]:
    """Replaces the plan's layers by rank-local ones; returns module name -> style."""
    prefix = model.base_model_prefix + "."
    styles: dict[str, str] = {}
    for name, module in list(model.named_modules()):
        style = plan.style(name[len(prefix) :]) if name.startswith(prefix) else None
        if style is None:
            continue
        if type(module) is not nn.Linear:
            raise ModelLoadError(
                f"tensor-parallel plan names {name}, a {type(module).__name__}, not a linear layer"
            )
        bias = module.bias is not None
        if style == COLWISE:
            rows = colwise_rows(name, module.out_features, plan, group.rank)
            local = nn.Linear(
                module.in_features, rows[1] - rows[0], bias=bias, device="meta", dtype=dtype
            )
            setattr(local, FULL_OUT, module.out_features)  # the adapters' shape check reads it
        else:
            if module.in_features % plan.world_size:
                raise ConfigError(
                    f"--tensor-parallel-size {plan.world_size} does not divide the "
                    f"{module.in_features} input features of {name}"
                )
            local = RowParallelLinear(
                module.in_features,
                module.out_features,
                bias=bias,
                group=group,
                device="meta",
                dtype=dtype,
            )
        model.set_submodule(name, local)
        styles[name] = style
    return styles


def _split_head(model: nn.Module, group: RankGroup, dtype: torch.dtype) -> tuple[str | None, bool]:
    """Replaces the LM head by its vocabulary slice where the model class's plan splits it;
    returns (the head's module name or None when it stays whole, whether it is tied to the
    input embedding)."""
    head = model.get_output_embeddings()
    head_plan = getattr(model, "_tp_plan", None) or {}
    name = next((n for n, m in model.named_modules() if m is head), None)
    if name is None or head_plan.get(name) != VOCAB or type(head) is not nn.Linear:
        return None, False
    tied = head.weight is model.get_input_embeddings().weight
    local = VocabParallelHead(
        head.in_features,
        head.out_features,
        bias=head.bias is not None,
        group=group,
        device="meta",
        dtype=dtype,
    )
    model.set_submodule(name, local)
    return name, tied


def colwise_rows(name: str, out_features: int, plan: ShardPlan, rank: int) -> tuple[int, int]:
    """[first, last) of the output features (weight rows) rank `rank` holds."""
    kv_head = plan.kv_head_of(rank)
    if kv_head is not None and out_features == plan.num_kv_heads * plan.head_dim:
        return kv_head * plan.head_dim, (kv_head + 1) * plan.head_dim  # replicated KV head
    if out_features % plan.world_size:
        raise ConfigError(
            f"--tensor-parallel-size {plan.world_size} does not divide the "
            f"{out_features} output features of {name}"
        )
    share = out_features // plan.world_size
    return rank * share, (rank + 1) * share


def _read_parameters(
    model: nn.Module,
    files: dict[str, Path],
    styles: dict[str, str],
    plan: ShardPlan,
    group: RankGroup,
    dtype: torch.dtype,
    skip: set[str],
) -> None:
    from safetensors import safe_open

    handles: dict[Path, Any] = {}
    loaded: dict[int, nn.Parameter] = {}  # id of the meta parameter -> its real one (ties)
    missing: list[tuple[nn.Module, str, str]] = []
    try:
        for module_name, module in model.named_modules():
            for param_name, param in list(module._parameters.items()):
                if param is None:
                    continue
                owner = module_name.removesuffix(".partial").removesuffix(f".{CHILD}")
                key = f"{owner}.{param_name}" if owner else param_name
                if key in skip:
                    continue
                if id(param) in loaded:
                    module._parameters[param_name] = loaded[id(param)]
                    continue
                if key not in files:
                    missing.append((module, param_name, key))
                    continue
                path = files[key]
                if path not in handles:
                    handles[path] = safe_open(path, framework="pt")
                view = handles[path].get_slice(key)
                tensor = _slice(view, styles.get(owner), param_name, plan, group.rank)
                if tensor.shape != param.shape:
                    raise ModelLoadError(
                        f"checkpoint tensor {key} gives {tuple(tensor.shape)} for this rank, "
                        f"the model expects {tuple(param.shape)}"
                    )
                real = nn.Parameter(tensor.to(dtype=dtype, device=group.device).contiguous())
                real.requires_grad_(False)
                loaded[id(param)] = real
                module._parameters[param_name] = real
    finally:
        handles.clear()
    for module, param_name, key in missing:
        param = module._parameters[param_name]
        if id(param) not in loaded:  # not tied to anything that was read
            raise ModelLoadError(f"the checkpoint has no tensor {key}")
        module._parameters[param_name] = loaded[id(param)]


def _slice(view, style: str | None, param_name: str, plan: ShardPlan, rank: int) -> torch.Tensor:
    """This rank's part of a checkpoint tensor (`view` is safetensors' lazy slice)."""
    if style == COLWISE:
        first, last = colwise_rows("", view.get_shape()[0], plan, rank)
        return view[first:last]
    if style == VOCAB:
        first, last = vocab_rows(view.get_shape()[0], plan.world_size, rank)
        return view[first:last]
    if style == ROWWISE and param_name == "weight":
        share = view.get_shape()[1] // plan.world_size
        return view[:, rank * share : (rank + 1) * share]
    return view[:]
