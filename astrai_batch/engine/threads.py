"""How many CPU threads torch's operators use in this process.

torch defaults to one thread per core. When other processes share the cores (a cron host, a
CI runner), its OpenMP threads wait on each other and throughput can collapse by an order of
magnitude; fewer threads than cores is then much faster. The setting is process-wide, so the
job and bench entry points apply it once, before loading the model.
"""

from __future__ import annotations

import torch

from astrai_batch.errors import ConfigError


def set_cpu_threads(threads: int | None) -> int:
    """Sets torch's intra-op threads (None keeps torch's default); returns the count in effect."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
            raise ConfigError(f"threads must be a positive int, got {threads!r}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def describe_threads(count: int) -> str:
    return f"{count} CPU thread{'' if count == 1 else 's'}"
