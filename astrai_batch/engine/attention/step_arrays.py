"""One step's batch on the host, as attention and the kernels read it, and its way to the device.

Built by `runner.step_buffers` every step; kept here, below the runner, so attention's plans
can name it without importing the runner.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class StepArrays(NamedTuple):
    """One step's batch on the host (numpy, int64). Token rows index the packed batch.

    A named tuple, not a frozen dataclass: built every step, after a forward has swept the
    caches, where a dataclass's field-by-field `__init__` costs tens of microseconds."""

    token_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    write_slots: np.ndarray  # [T] flat KV slot of each new token
    logit_rows: np.ndarray  # [L] the last token row of each chunk that wants logits
    token_start: np.ndarray  # [C] first token row of each chunk
    num_tokens: np.ndarray  # [C]
    context_start: np.ndarray  # [C] position of each chunk's first token
    page_tables: np.ndarray  # [C, P] each chunk's pages, as far as it needs, zero-padded
    decodes: np.ndarray  # [D] chunks of one token, in chunk order
    longest_context: int  # the most tokens any chunk's sequence has once they are written
    # [T] the last key position each query sees where some query sees past its own position
    # (an image's placeholders attending to each other: `engine.vision.image_spans`); None:
    # every query's own position (causal)
    key_limits: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        """[C] context length of each chunk once its tokens are written."""
        return self.context_start + self.num_tokens

    def pages_needed(self, page_size: int) -> np.ndarray:
        return -(-self.lengths // page_size)


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor on `device`: shared memory on CPU; on CUDA a pinned copy sent
    without blocking (torch's pinned-memory cache keeps the block until the copy is done)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
