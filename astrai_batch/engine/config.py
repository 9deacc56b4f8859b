"""Engine configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from astrai_batch.cache.layout import KV_LAYOUTS
from astrai_batch.checks import require_positive_int
from astrai_batch.engine.attention.backends import check_backend_name
from astrai_batch.engine.vision.encoder_cache import DEFAULT_ENCODER_CACHE_BYTES
from astrai_batch.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches and how big its KV cache is.

    The pool is sized by `num_pages` when given, else by `kv_cache_memory` bytes, else by
    `memory_budget.default_kv_budget`: on CUDA `gpu_memory_utilization` of the GPU's memory
    less the weights and a profiled activation peak, on CPU a share of the available RAM;
    never more than `max_num_seqs` sequences of the full context use. `max_model_len` caps
    prompt + output below the model's own limit; in the contiguous `kv_layout` it is also
    each seat's size.
    """

    page_size: int = 16
    num_pages: int | None = None
    kv_cache_memory: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 1024
    enable_prefix_cache: bool = True
    kv_layout: str = "paged"  # or "contiguous": one seat of max_model_len slots per sequence
    max_model_len: int | None = None
    seed: int = 0
    lookahead: int | None = None  # waiting requests pulled ahead; None = 2 * max_num_seqs
    max_wait_steps: int = 64  # a waiting request older than this many admissions goes first
    # "invariant": a row's logits never depend on what runs beside it; "fast": step-shaped
    # kernels (last bits move with the batch; for jobs that neither sample nor resume)
    numerics: str = "invariant"
    gpu_memory_utilization: float = 0.9  # vLLM's meaning: share of the GPU this engine may use
    # sdpa (portable, batch-invariant), flashinfer or flash-attn (CUDA kernels, fast numerics
    # only), auto: see `attention_backends.resolve_attention_backend`
    attention_backend: str = "auto"
    # decode-only steps replayed as CUDA graphs at bucketed shapes; None: on exactly on CUDA
    cuda_graphs: bool | None = None
    # a vision-language model's image features kept by image content (`engine.vision.
    # encoder_cache`, least recently used out past this many bytes); 0: none kept
    encoder_cache_memory: int = DEFAULT_ENCODER_CACHE_BYTES

    def __post_init__(self) -> None:
        require_positive_int("page_size", self.page_size)
        require_positive_int("max_num_seqs", self.max_num_seqs)
        require_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        require_positive_int("max_wait_steps", self.max_wait_steps)
        for name in ("num_pages", "kv_cache_memory", "max_model_len", "lookahead"):
            value = getattr(self, name)
            if value is not None:
                require_positive_int(name, value)
        check_utilization(self.gpu_memory_utilization)
        value = self.encoder_cache_memory
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"encoder_cache_memory must be a non-negative int, got {value!r}")
        if not isinstance(self.enable_prefix_cache, bool):
            raise ConfigError(
                f"enable_prefix_cache must be a bool, got {type(self.enable_prefix_cache).__name__}"
            )
        if self.kv_layout not in KV_LAYOUTS:
            raise ConfigError(
                f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {self.kv_layout!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {self.seed!r}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ConfigError(
                f"cuda_graphs must be a bool or None, got {type(self.cuda_graphs).__name__}"
            )
        if self.numerics not in ("invariant", "fast"):
            raise ConfigError(f"numerics must be 'invariant' or 'fast', got {self.numerics!r}")
        check_backend_name(self.attention_backend)

    @property
    def waiting_capacity(self) -> int:
        return self.lookahead if self.lookahead is not None else 2 * self.max_num_seqs

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**values)


def check_utilization(value: object) -> None:
    """`gpu_memory_utilization` is a share of the GPU: a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"gpu_memory_utilization must be a number in (0, 1], got {value!r}")
