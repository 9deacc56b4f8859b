"""The tensor-parallel options' combinations with the others, refused before anything loads."""

from __future__ import annotations

from typing import Any

from astrai_batch.errors import ConfigError


def check_tensor_parallel_options(config: Any) -> None:
    size = config.tensor_parallel_size
    if size == 1:
        return
    if config.executor == "ray":
        raise ConfigError(
            "--tensor-parallel-size with --executor ray is not supported yet; run "
            "--executor local with --tensor-parallel-size, or --executor ray without it"
        )
    if config.cuda_graphs:
        raise ConfigError("cuda_graphs cannot be used with --tensor-parallel-size > 1")
