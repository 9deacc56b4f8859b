"""`--device auto` and `--dtype auto`: the GPU when there is one, in the dtype it runs fast.

Resolved once, where a configuration is built (`JobConfig`, `BenchConfig`), so everything
after it (the job's identity, the summary, the model load) sees one concrete device and
dtype: a run given `auto` and a resume given `cuda` / `bfloat16` on the same machine are the
same job. torch is imported only when `auto` must be resolved.

On the CPU `auto` is bfloat16 where the CPU has native bfloat16 dot products (the
`avx512_bf16` or `amx_bf16` flags: oneDNN's bf16 GEMMs then run 3-5x float32's), else
float32 (without them bfloat16 is emulated and slower than float32). Both keep invariant
numerics (`engine.numerics.blas_rows`). A Ray job's CPU workers may be other machines than
the driver, so there `auto` stays float32.
"""

from __future__ import annotations

import os

AUTO = "auto"
DEVICE_HELP = "cuda, cpu, cuda:N, or auto (cuda when available, else cpu)."
DTYPE_HELP = (
    "float32, bfloat16, float16, or auto (bfloat16 on CUDA and on CPUs with native bf16 "
    "dot products (avx512_bf16, amx_bf16), else float32)."
)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of native bfloat16 dot products


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


def resolve_dtype_name(
    name: str, device: str, *, cpu_flags: frozenset[str] | None = None, local: bool = True
) -> str:
    """`name` itself, or for `auto` the dtype `choose_dtype` picks."""
    return choose_dtype(name, device, cpu_flags=cpu_flags, local=local)[0]


def choose_dtype(
    name: str, device: str, *, cpu_flags: frozenset[str] | None = None, local: bool = True
) -> tuple[str, str]:
    """(dtype, why) for a `--dtype`: a given name is kept; `auto` is bfloat16 on CUDA and on
    a CPU with native bf16 dot products, float32 elsewhere. `cpu_flags`: this CPU's flags
    (read from /proc/cpuinfo when None); `local` False: the engine runs on other machines
    (Ray workers), whose CPUs are not this one's."""
    if name.strip().lower() != AUTO:
        return name, "given"
    if device_kind(device) == "cuda":
        return "bfloat16", "auto: CUDA runs bfloat16"
    if device_kind(device) != "cpu":
        return "float32", f"auto: float32 on {device_kind(device)}"
    if not local:
        return "float32", "auto: the workers' CPUs are not known here"
    flags = host_cpu_flags() if cpu_flags is None else cpu_flags
    native = [flag for flag in BF16_FLAGS if flag in flags]
    if native:
        return "bfloat16", f"auto: this CPU has native bf16 dot products ({', '.join(native)})"
    return "float32", "auto: this CPU has no native bf16 dot products (avx512_bf16, amx_bf16)"


CPU_FLAGS_ENV = "ASTRAI_BATCH_CPU_FLAGS"


def host_cpu_flags() -> frozenset[str]:
    """The CPU flags `auto` reads: $ASTRAI_BATCH_CPU_FLAGS when set (space-separated; pins
    the choice, e.g. for a fleet of mixed CPUs, or in the tests), else /proc/cpuinfo's."""
    pinned = os.environ.get(CPU_FLAGS_ENV)
    if pinned is not None:
        return frozenset(pinned.split())
    return proc_cpu_flags()


def proc_cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def device_kind(device: str) -> str:
    """cpu, cuda, ...: a device name without its index."""
    return device.split(":", 1)[0].strip().lower()
