"""Which attention computes a step: the portable SDPA paths or a paged CUDA kernel.

`sdpa` is the engine's own attention (`attention.py`, `block_attention.py`): it runs
anywhere, keeps batch-invariant numerics, and is the reference every other backend is
compared with. `flashinfer` and `flash-attn` call one CUDA kernel per layer for every prefill
chunk and decode of the step, reading keys and values from the paged pool in place.

Neither kernel keeps batch invariance, so with invariant numerics (the default) `auto` is
always `sdpa` and naming a kernel is refused. The kernels choose their tiling per step
(flash-attn's split-KV heuristic and its one-query fast path; FlashInfer's query tile from
the step's query lengths and its split-KV plan), so a token computed as a decode beside 255
others, alone, or inside a prefill chunk after a preemption is reduced in different orders.
FlashInfer's `fixed_split_size` fixes the split, not the query tile, so it does not make a
recomputed prefill give a decode's bits either. Under `--fast-numerics` on CUDA, `auto`
takes the first usable of flashinfer, flash-attn, sdpa.

Resolution is a pure function of the options and what is importable, so jobs refuse a bad
choice before any model loads; the engine resolves again with the model's real dtype.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astrai_batch.errors import ConfigError

ATTENTION_BACKENDS = ("auto", "sdpa", "flashinfer", "flash-attn")
AUTO_ORDER = ("flashinfer", "flash-attn")  # under fast numerics on CUDA, before sdpa
KERNEL_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class BackendSpec:
    """What a backend needs and promises."""

    name: str
    keeps_invariance: bool
    module: str | None = None  # the package to import (kernels only)
    package: str = ""  # how people call it in messages
    page_size_multiple: int = 1  # the kernel's page (block) size constraint
    # whether a decode step may be captured in a CUDA graph: not for the kernels yet, whose
    # metadata is built on the host per step (FlashInfer's plan() cannot be captured at all)
    cuda_graphs: bool = True


BACKEND_SPECS = {
    "sdpa": BackendSpec("sdpa", keeps_invariance=True),
    "flashinfer": BackendSpec(
        "flashinfer", False, "flashinfer", "FlashInfer", page_size_multiple=1, cuda_graphs=False
    ),
    # FA2 checks `page_block_size % 256 == 0` for a paged KV cache (flash_api.cpp, 2.8.x)
    "flash-attn": BackendSpec(
        "flash-attn", False, "flash_attn", "flash-attn", page_size_multiple=256, cuda_graphs=False
    ),
}


def check_backend_name(value: object) -> None:
    if value not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {value!r}"
        )


def module_importable(module: str) -> bool:
    """Whether a package is installed, without importing it (importing CUDA code is slow)."""
    return importlib.util.find_spec(module) is not None


def resolve_attention_backend(
    requested: str,
    *,
    device: Any,
    numerics: str,
    page_size: int,
    dtype: Any,
    importable: Callable[[str], bool] = module_importable,
) -> str:
    """The backend a run uses: `requested` itself, checked, or what `auto` picks.

    `device` and `dtype` are torch objects or their names ("cuda:0", "bfloat16"): this module
    imports no torch, as configuration is checked without it. Raises `ConfigError` with one
    line in the user's terms when a named kernel cannot run.
    """
    check_backend_name(requested)
    on_cuda = _device_type(device) == "cuda"
    dtype = str(dtype).removeprefix("torch.")
    if requested == "auto":
        if numerics != "fast" or not on_cuda:
            return "sdpa"
        for name in AUTO_ORDER:
            if _problem(BACKEND_SPECS[name], page_size, dtype, importable) is None:
                return name
        return "sdpa"
    spec = BACKEND_SPECS[requested]
    if spec.module is None:
        return requested
    if not on_cuda:
        raise ConfigError(f"--attention-backend {requested} needs a CUDA device")
    if numerics != "fast" and not spec.keeps_invariance:
        raise ConfigError(
            f"--attention-backend {requested} does not keep batch-invariant numerics; "
            "add --fast-numerics or use --attention-backend sdpa"
        )
    problem = _problem(spec, page_size, dtype, importable)
    if problem is not None:
        raise ConfigError(f"--attention-backend {requested} {problem}")
    return requested


def _problem(
    spec: BackendSpec, page_size: int, dtype: str, importable: Callable[[str], bool]
) -> str | None:
    """Why a kernel backend cannot run here (the tail of a one-line message), or None."""
    if not importable(spec.module):
        return f"needs {spec.package}: pip install 'astrai-batch[{spec.name}]'"
    if page_size % spec.page_size_multiple:
        return f"needs --page-size a multiple of {spec.page_size_multiple}, got {page_size}"
    if dtype not in KERNEL_DTYPES:
        return f"needs --dtype bfloat16 or float16, got {dtype}"
    return None


def _device_type(device: Any) -> str:
    kind = getattr(device, "type", None)  # a torch.device
    return kind if isinstance(kind, str) else str(device).split(":", 1)[0].strip().lower()


def resolve_from_options(
    requested: str, *, device: str, dtype: str, numerics: str, page_size: int
) -> str:
    """`resolve_attention_backend` from a run's option values (`dtype` a name, maybe auto),
    before any model loads."""
    from astrai_batch.engine.model.loaded import resolve_dtype  # torch: only when a run checks

    return resolve_attention_backend(
        requested,
        device=device,
        numerics=numerics,
        page_size=page_size,
        dtype=resolve_dtype(dtype, device=device),
    )


def import_kernel_module(backend: str) -> Any:
    """The package of a kernel backend; an installed one that fails to import (built for
    another CUDA or torch) is refused in one line."""
    spec = BACKEND_SPECS[backend]
    try:
        return importlib.import_module(spec.module)
    except ImportError as exc:
        raise ConfigError(
            f"--attention-backend {backend}: {spec.package} does not import ({exc})"
        ) from exc
