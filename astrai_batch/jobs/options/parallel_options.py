"""The tensor-parallel options' combinations with the others, refused before anything loads."""

from __future__ import annotations

from typing import Any

from astrai_batch.errors import ConfigError


def check_tensor_parallel_options(config: Any) -> None:
    size = config.tensor_parallel_size
    if size == 1:
        return
    cuda = config.device.split(":", 1)[0].strip().lower() == "cuda"
    if config.executor == "ray" and cuda and config.worker_gpus < size:
        # one engine's ranks are processes of its actor, on its machine and its GPUs
        raise ConfigError(
            f"--executor ray with --tensor-parallel-size {size} needs --worker-gpus {size} "
            f"(each worker's ranks run on its own GPUs), got {config.worker_gpus:g}"
        )
    if config.cuda_graphs:
        raise ConfigError("cuda_graphs cannot be used with --tensor-parallel-size > 1")
