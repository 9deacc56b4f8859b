"""A loaded model as the engine sees it, and dtype names.

Kept apart from the loader so that model checks and kernels can name `LoadedModel` and
`resolve_dtype` without importing the loading code (which imports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astrai_batch.errors import ConfigError, ModelLoadError

_DTYPES: MappingProxyType[str, torch.dtype] = MappingProxyType(
    {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model ready for the engine: eval mode, no gradients, on its device and dtype."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: str
    architecture: str
    max_model_len: int
    eos_token_ids: frozenset[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    has_chat_template: bool
    # multi-head latent attention (DeepSeek V2/V3): the pages hold one latent vector per token
    # and layer (`num_kv_heads` 1, `head_dim` kv_lora_rank + qk_rope_head_dim), `KVPool(latent)`
    kv_latent: bool = False
    # tensor parallelism: this process's `engine.parallel.launch.TensorParallel` (its rank,
    # group and, on rank 0, the other ranks' processes); `model` is then this rank's shard
    # and `num_kv_heads` its own KV heads
    parallel: Any = None
    # the start-up invariance probes this model passed, by what they ran (`invariance_probe`):
    # a verdict is a function of the model, its device and the probe's configuration, so
    # further engines over the same model and configuration need not run it again
    invariance_passed: set = field(default_factory=set, repr=False)
    # the BLAS's and the flash kernel's probes at engine start, by what they probed (shapes,
    # dtype, torch's thread count): their results are functions of those, so further engines
    # over the same model skip them (`runner.model_runner`)
    probe_results: dict = field(default_factory=dict, repr=False)
    # a vision-language model's vision half (`engine.vision.tower.VisionTower`); `model` is
    # then its language half, run like any causal LM. None: a text model
    vision: Any = None

    def __post_init__(self) -> None:
        for field_name in ("max_model_len", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LoadedModel.{field_name} must be a positive int, got {value!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.eos_token_ids):
            raise ValueError(
                f"LoadedModel.eos_token_ids must be token ids, got {self.eos_token_ids}"
            )

    def close(self) -> None:
        """Ends the other tensor-parallel ranks, if any (the model is unusable afterwards)."""
        if self.parallel is not None:
            self.parallel.close()

    def check_invariants(self) -> None:
        """Raise `ModelLoadError` unless the model is still as `load_model` left it."""
        if self.model.training:
            raise ModelLoadError(f"Model {self.name!r} is in training mode; call model.eval()")
        if any(p.requires_grad for p in self.model.parameters()):
            raise ModelLoadError(f"Model {self.name!r} has parameters that require gradients")
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelLoadError(f"Model {self.name!r} has a tokenizer that is not fast")
        layers = self.model.config.num_hidden_layers
        if layers != self.num_layers:
            raise ModelLoadError(
                f"Model {self.name!r}: num_layers {self.num_layers} but the config has {layers}"
            )


def resolve_dtype(name: str | torch.dtype, *, device: torch.device | str = "cpu") -> torch.dtype:
    """The torch dtype for a name; "auto" as `engine.device_choice.choose_dtype` picks it
    (bfloat16 on CUDA and on CPUs with native bf16 dot products, else float32).

    Whatever the checkpoint was saved in: bfloat16 is what a GPU or a bf16 CPU runs fast (and
    what the KV pool then stores), float32 what other CPUs run at least as fast.
    """
    if isinstance(name, torch.dtype):
        if name in _DTYPES.values():
            return name
        raise ConfigError(f"dtype {name} is not supported; use float32, bfloat16 or float16")
    if not isinstance(name, str):
        raise ConfigError(f"dtype must be a string or torch.dtype, got {type(name).__name__}")
    key = name.strip().lower()
    if key == "auto":
        from astrai_batch.engine.device_choice import resolve_dtype_name

        return _DTYPES[resolve_dtype_name(key, torch.device(device).type)]
    if key in _DTYPES:
        return _DTYPES[key]
    raise ConfigError(
        f"unknown dtype {name!r}; expected one of: {', '.join(_DTYPES)}, auto",
    )
