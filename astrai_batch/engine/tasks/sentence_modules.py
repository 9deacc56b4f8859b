"""A sentence-transformers model's modules, read from its directory (or the local hub cache).

`modules.json` lists the modules in order: the Transformer (the model itself: its final hidden
states), then Pooling (`1_Pooling/config.json`), then any Dense (`2_Dense/config.json` and its
weights) and Normalize modules. An embedding job runs exactly these; any other module, a
setting that changes what they compute, or a Pooling that concatenates several modes is
refused here, before a row runs, naming the module: skipping one would give vectors that look
right and are not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_batch.engine.tasks.embedding_types import DenseStep, NormalizeStep
from astrai_batch.errors import ConfigError

# sentence-transformers' pooling modes (`pooling_mode` and the older `pooling_mode_*` keys,
# in its order) by our names
_MODES = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean-sqrt-len",
    "weightedmean": "weighted-mean",
    "lasttoken": "last",
}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
}
_EMBEDDING = "sentence_embedding"  # the features key Dense and Normalize act on by default


@dataclass(frozen=True)
class SentenceModules:
    """What the model declares: its pooling (None without a Pooling module), the Dense and
    Normalize steps after it, and the Transformer's max_seq_length (None: unset)."""

    pooling: str | None
    head: tuple[DenseStep | NormalizeStep, ...]
    max_seq_length: int | None


def read_sentence_modules(model_dir: str | Path | None) -> SentenceModules | None:
    """The model's sentence-transformers modules, or None where it has no `modules.json`.
    Raises ConfigError naming what it cannot run."""
    root = _model_root(model_dir)
    if root is None:
        return None
    entries = _json(root / "modules.json", "modules.json")
    if not isinstance(entries, list):
        raise ConfigError(f"{root / 'modules.json'} is not a list of modules")
    _check_prompts(root)
    pooling: str | None = None
    head: list[DenseStep | NormalizeStep] = []
    max_seq_length = None
    for position, entry in enumerate(entries):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        folder = str(entry.get("path", ""))
        where = f"{folder or '.'} ({entry.get('type')})"
        if kind == "Transformer" and position == 0:
            max_seq_length = _transformer(root / folder, where)
        elif kind == "Pooling" and pooling is None and position > 0:
            pooling = _pooling(_json(root / folder / "config.json", where), where)
        elif kind == "Dense" and pooling is not None:
            head.append(_dense(root / folder, where))
        elif kind == "Normalize" and pooling is not None:
            _only_sentence_embedding(_optional_json(root / folder / "config.json", where), where)
            head.append(NormalizeStep())
        else:
            raise ConfigError(
                f"the model's sentence-transformers module {where} at position {position} is "
                "not supported; an embedding job runs Transformer, then Pooling, then Dense "
                "and Normalize modules"
            )
    return SentenceModules(pooling, tuple(head), max_seq_length)


def _transformer(folder: Path, where: str) -> int | None:
    config = _optional_json(folder / "sentence_bert_config.json", where)
    if config.get("do_lower_case"):
        raise ConfigError(
            f"the model's sentence-transformers module {where} lowercases its input "
            "(do_lower_case in sentence_bert_config.json), which is not supported"
        )
    length = config.get("max_seq_length")
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def _pooling(config: dict[str, Any], where: str) -> str:
    if config.get("include_prompt") is False:
        raise ConfigError(
            f"the model's sentence-transformers Pooling {where} excludes prompt tokens "
            "(include_prompt false), which is not supported"
        )
    modes = config.get("pooling_mode")
    if modes is None:  # the older form: one boolean per mode, mean when none is set
        modes = [mode for key, mode in _LEGACY_KEYS.items() if config.get(key)] or ["mean"]
    if isinstance(modes, str):
        modes = [modes]
    if not isinstance(modes, list) or len(modes) != 1 or modes[0] not in _MODES:
        named = modes if not isinstance(modes, list) else ", ".join(map(str, modes))
        raise ConfigError(
            f"the model's sentence-transformers Pooling {where} asks for pooling {named}; "
            f"supported: one of {', '.join(_MODES)} (concatenated modes are not)"
        )
    return _MODES[modes[0]]


def _dense(folder: Path, where: str) -> DenseStep:
    import torch

    config = _json(folder / "config.json", where)
    _only_sentence_embedding(config, where)
    if config.get("use_residual"):
        raise ConfigError(
            f"the model's sentence-transformers Dense {where} adds a residual connection "
            "(use_residual), which is not supported"
        )
    name = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    activation = _ACTIVATIONS.get(str(name))
    if activation is None:
        raise ConfigError(
            f"the model's sentence-transformers Dense {where} applies {name}; supported "
            f"activations: {', '.join(_ACTIVATIONS)}"
        )
    weights = _dense_weights(folder, where)
    weight, bias = weights.get("linear.weight"), weights.get("linear.bias")
    shape = [config.get("out_features"), config.get("in_features")]
    if weight is None or list(weight.shape) != shape:
        raise ConfigError(
            f"the model's sentence-transformers Dense {where}: no linear.weight {shape}"
        )
    if config.get("bias", True) != (bias is not None):
        raise ConfigError(f"the model's sentence-transformers Dense {where}: bias does not match")
    return DenseStep(
        weight.to(torch.float32),
        None if bias is None else bias.to(torch.float32),
        activation,
        folder.name,
    )


def _dense_weights(folder: Path, where: str) -> dict[str, Any]:
    import torch

    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConfigError(f"the model's sentence-transformers Dense {where} has no weights file")


def _only_sentence_embedding(config: dict[str, Any], where: str) -> None:
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, _EMBEDDING) not in (_EMBEDDING, None):
            raise ConfigError(
                f"the model's sentence-transformers module {where} acts on {config[key]!r} "
                f"({key}), not the sentence embedding, which is not supported"
            )


def _check_prompts(root: Path) -> None:
    config = _optional_json(root / "config_sentence_transformers.json", "its settings")
    if config.get("default_prompt_name"):
        raise ConfigError(
            "the model's sentence-transformers settings (config_sentence_transformers.json) "
            f"prepend the prompt {config['default_prompt_name']!r} to every input "
            "(default_prompt_name), which is not supported; give the prompt in the rows"
        )


def _json(path: Path, where: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the model's sentence-transformers {where}: {exc}") from None


def _optional_json(path: Path, where: str) -> dict[str, Any]:
    if not path.is_file():
        return {}
    config = _json(path, where)
    return config if isinstance(config, dict) else {}


def _model_root(model_dir: str | Path | None) -> Path | None:
    """The folder holding the model's `modules.json`: the model directory, or a hub model's
    snapshot in the local cache (never downloads)."""
    if model_dir is None:
        return None
    root = Path(model_dir)
    if (root / "modules.json").is_file():
        return root
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(model_dir), "modules.json")
    except Exception:  # not a repo id, or no hub library: no config
        return None
    return Path(found).parent if isinstance(found, str) else None
