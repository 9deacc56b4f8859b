"""The one way a step's host data reaches the device: pinned staging, non-blocking copies.

A copy from pageable host memory (`tensor.to(device)`, `torch.tensor(..., device=)`) makes
the host wait for the device to finish what is queued before it, several times a step. Every
per-step host-to-device copy of the runner, its attention plans (`block_plan`,
`cascade_plan`) and sampling's index columns goes through one `HostStaging`: the host array is
placed in pinned memory (torch's pinned-memory cache keeps each block until its copy is done)
and sent with `non_blocking=True`, so the only synchronization in a step is reading the
sampled tokens. On CPU the host tensor is used as it is (shared memory, no copy). `copies`
counts what went through, so a test can hold the count per step to what the step needs.
Kept below the runner (as `step_arrays`), so attention's plans can name it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class HostStaging:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.copies = 0

    def array(self, array: np.ndarray) -> torch.Tensor:
        """A numpy array on the device."""
        return self.tensor(torch.from_numpy(np.ascontiguousarray(array)))

    def values(self, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
        """A list of Python numbers on the device, as `dtype`."""
        return self.tensor(torch.tensor(values, dtype=dtype))

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device."""
        self.copies += 1
        if self.device.type == "cpu":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def into(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """Copies a pinned host buffer the caller keeps (CUDA graphs' static inputs) into
        `target` on the device; on CPU the two may be one tensor."""
        self.copies += 1
        if target.data_ptr() != source.data_ptr():
            target.copy_(source, non_blocking=True)
