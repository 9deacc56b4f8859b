"""Which token rows of a step use which adapter, grouped once per step on the host.

Every wrapped layer of the step reads the same grouping: the rows of each adapter as one
segment of a single gather (rows sorted by adapter, S-LoRA / Punica style). With tiles, a
layer runs one gather, two batched GEMMs per adapter present over its segment's tiles (its
matrices broadcast to every tile) and one scatter-add, whatever the number of rows; without
(fast numerics), two small GEMMs and one scatter-add per adapter present. With fixed tiles
(invariant numerics) each segment is padded to whole tiles with copies of its first row; a
padded row's result is dropped, and since a GEMM row never depends on the other rows of a
fixed-shape tile, what fills the padding does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.step_arrays import to_device


class Segment(NamedTuple):
    slot: int  # the adapter (1-based; 0 is the base model and never has a segment)
    start: int  # first row of the segment in the gathered rows
    count: int  # real rows
    padded: int  # rows gathered: count, or count rounded up to whole tiles
    targets: torch.Tensor  # [count] the step rows the segment's deltas are added to


class StepAdapterRows(NamedTuple):
    gather: torch.Tensor  # [sum of padded] step rows, segment after segment
    segments: tuple[Segment, ...]
    tile_rows: int | None  # None: one GEMM per segment (fast numerics)
    # with tiles: the gathered positions of the real rows and the step rows they are added to
    # (segment after segment), for one gather and one scatter-add per layer
    real: torch.Tensor | None = None  # [real rows] positions in `gather`
    targets: torch.Tensor | None = None  # [real rows] step rows


def group_rows(
    chunk_slots: Sequence[int],
    chunk_tokens: Sequence[int],
    *,
    tile_rows: int | None,
    device: torch.device,
) -> StepAdapterRows | None:
    """The grouping of a step whose chunk i has `chunk_tokens[i]` consecutive token rows, all of
    adapter `chunk_slots[i]`; None when no row uses an adapter."""
    if not any(chunk_slots):
        return None
    slots = np.repeat(np.asarray(chunk_slots, dtype=np.int64), chunk_tokens)
    lora = np.flatnonzero(slots)
    order = lora[np.argsort(slots[lora], kind="stable")]
    sorted_slots = slots[order]
    cuts = [0, *(np.flatnonzero(np.diff(sorted_slots)) + 1).tolist(), len(order)]
    targets = to_device(order, device)
    gather: list[np.ndarray] = []
    segments = []
    position = 0
    for begin, end in pairwise(cuts):
        count = end - begin
        padded = count if tile_rows is None else -(-count // tile_rows) * tile_rows
        gather.append(order[begin:end])
        if padded > count:
            gather.append(np.full(padded - count, order[begin], dtype=np.int64))
        segments.append(
            Segment(int(sorted_slots[begin]), position, count, padded, targets[begin:end])
        )
        position += padded
    gathered = to_device(np.concatenate(gather), device)
    if tile_rows is None:
        return StepAdapterRows(gathered, tuple(segments), None)
    real = np.concatenate([np.arange(s.start, s.start + s.count) for s in segments])
    return StepAdapterRows(
        gathered, tuple(segments), tile_rows, to_device(real.astype(np.int64), device), targets
    )
