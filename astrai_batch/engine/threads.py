"""How many CPU threads torch's operators use in this process.

torch defaults to one thread per core. When other processes share the cores (a cron host, a
CI runner), its OpenMP threads wait on each other and throughput can collapse by an order of
magnitude; fewer threads than cores is then much faster. The setting is process-wide, so the
job and bench entry points apply it once, before loading the model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from astrai_batch.errors import ConfigError

CGROUP_ROOT = Path("/sys/fs/cgroup")


def set_cpu_threads(threads: int | None) -> int:
    """Sets torch's intra-op threads (None: one per CPU this process may use,
    `available_cpus`); returns the count in effect."""
    if threads is None:
        threads = available_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
        raise ConfigError(f"threads must be a positive int, got {threads!r}")
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may actually run on: the CPUs of its affinity mask (taskset,
    cpusets), capped by its cgroup's CPU quota (a container's --cpus), rounded up; at least 1.
    torch's own default counts the machine's cores, so a container given 2 CPUs of 64 would
    run 64 threads that wait on each other."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), or None when there is
    none: cgroup v2's ``cpu.max`` (``max 100000`` means none), else v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 means none)."""
    for directory in _own_cgroup_dirs(root):
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            pass
        else:
            return None if quota == "max" else int(quota) / int(period)
        try:
            quota_us = int((directory / "cpu.cfs_quota_us").read_text())
            period_us = int((directory / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def _own_cgroup_dirs(root: Path) -> list[Path]:
    """This process's cgroup directory (from /proc/self/cgroup), then the root (inside a
    container the namespace's root is its own cgroup)."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" or "cpu" in controllers.split(","):
            relative = path.lstrip("/")
            for base in (root, root / "cpu", root / "cpu,cpuacct"):
                if relative and (base / relative).is_dir():
                    found.append(base / relative)
    return [*found, root, root / "cpu", root / "cpu,cpuacct"]


def describe_threads(count: int) -> str:
    return f"{count} CPU thread{'' if count == 1 else 's'}"
