"""The packed-batch rows of the prompt positions a step wants logits of (`logit_span`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def span_rows(chunks: Sequence, token_start: np.ndarray) -> np.ndarray | None:
    """The token rows of every chunk's `logit_span`, in chunk order, or None when no chunk
    has one (the common step: a generation without prompt logprobs)."""
    parts = []
    for i, chunk in enumerate(chunks):
        span = chunk.logit_span
        if span is not None:
            first = int(token_start[i])
            parts.append(np.arange(first + span[0], first + span[1], dtype=np.int64))
    return np.concatenate(parts) if parts else None
