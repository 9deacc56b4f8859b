"""The engine's options as a job checks them: the KV layout, the attention backend and CUDA
graphs, and which of their combinations can run, refused before anything loads."""

from __future__ import annotations

from astrai_batch.checks import require_type
from astrai_batch.engine.attention.backends import check_backend_name
from astrai_batch.engine.config import KV_LAYOUTS
from astrai_batch.errors import ConfigError


def check_engine_options(
    kv_layout: object, attention_backend: object, cuda_graphs: object, device: str
) -> None:
    check_backend_name(attention_backend)
    if kv_layout not in KV_LAYOUTS:
        raise ConfigError(f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {kv_layout!r}")
    if cuda_graphs is not None:
        require_type("cuda_graphs", cuda_graphs, bool)
        kind = device.split(":", 1)[0].strip().lower()
        if cuda_graphs and kind != "cuda":
            raise ConfigError(f"cuda_graphs needs device cuda, got device {device}")
        if cuda_graphs and attention_backend in ("flashinfer", "flash-attn"):
            raise ConfigError(
                f"cuda_graphs cannot be used with attention_backend {attention_backend} "
                "(its step metadata is planned on the host every step); use sdpa or turn "
                "cuda_graphs off"
            )
