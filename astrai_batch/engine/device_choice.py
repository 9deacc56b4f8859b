"""`--device auto` and `--dtype auto`: the GPU when there is one, in the dtype it runs fast.

Resolved once, where a configuration is built (`JobConfig`, `BenchConfig`), so everything
after it (the job's identity, the summary, the model load) sees one concrete device and
dtype: a run given `auto` and a resume given `cuda` / `bfloat16` on the same machine are the
same job. torch is imported only when `auto` must be resolved.
"""

from __future__ import annotations

AUTO = "auto"
DEVICE_HELP = "cuda, cpu, cuda:N, or auto (cuda when available, else cpu)."
DTYPE_HELP = "float32, bfloat16, float16, or auto (bfloat16 on CUDA, else float32)."


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device_name(name: str, *, cuda: bool | None = None) -> str:
    """`name` itself, or for `auto` "cuda" when CUDA is available (`cuda`: already known,
    e.g. Ray workers that are given GPUs) and "cpu" otherwise."""
    if name.strip().lower() != AUTO:
        return name
    if cuda is None:
        cuda = cuda_available()
    return "cuda" if cuda else "cpu"


def resolve_dtype_name(name: str, device: str) -> str:
    """`name` itself, or for `auto` bfloat16 on a CUDA device and float32 elsewhere (the
    rule of `engine.model.loaded.resolve_dtype`, by name)."""
    if name.strip().lower() != AUTO:
        return name
    return "bfloat16" if device_kind(device) == "cuda" else "float32"


def device_kind(device: str) -> str:
    """cpu, cuda, ...: a device name without its index."""
    return device.split(":", 1)[0].strip().lower()
