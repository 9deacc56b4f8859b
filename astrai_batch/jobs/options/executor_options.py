"""Where a job runs: the executor, and the Ray-only options, refused where they mean nothing."""

from __future__ import annotations

from astrai_batch.checks import require_type
from astrai_batch.errors import ConfigError

EXECUTORS = ("local", "ray")


def check_executor_options(
    executor: object,
    ray_address: object,
    workers: int,
    worker_threads: int,
    worker_gpus: object,
) -> None:
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be local or ray, got {executor!r}")
    if ray_address is not None:
        require_type("ray_address", ray_address, str)
    gpus = worker_gpus
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        raise ConfigError(f"worker_gpus must be a number >= 0, got {gpus!r}")
    # a local run given any of them would silently ignore it
    if executor == "local" and (
        ray_address is not None or workers != 1 or gpus or worker_threads != 1
    ):
        raise ConfigError(
            "ray_address, workers, worker_threads and worker_gpus need --executor ray"
        )
