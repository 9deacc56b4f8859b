"""Which machine and software a benchmark ran on, recorded with every results row."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

from astrai_batch import __version__

_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    cpu_cores: int  # logical CPUs this process may run on
    torch_threads: int
    device: str  # "cpu", or the accelerator's name, e.g. "cuda:0 NVIDIA H200"
    torch_version: str
    transformers_version: str
    astrai_batch_version: str
    python_version: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def machine_info(device: torch.device) -> MachineInfo:
    return MachineInfo(
        cpu_model=cpu_model(),
        cpu_cores=_usable_cpus(),
        torch_threads=torch.get_num_threads(),
        device=_device_name(device),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        astrai_batch_version=__version__,
        python_version=platform.python_version(),
    )


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in _CPUINFO.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> float | None:
    """The one-minute load average: how busy the machine was when a run started."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    return str(device)
