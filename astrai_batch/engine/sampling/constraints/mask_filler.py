"""Filling a step's token masks in a worker thread while the model forward runs.

`start` hands the constrained rows of the coming step to one worker thread, which fills all
their masks in one batched backend call; `wait` returns them once the forward is done. The
matchers are touched only by that thread between `start` and `wait`, and only by the engine
thread outside that window, so no lock is needed. One mask buffer is reused every step (grown
when a step samples more rows than before).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from astrai_batch.engine.sampling.constraints.backend import ConstraintBackend, Matcher


@dataclass(frozen=True)
class StepMasks:
    """The filled masks of one step: `rows` are positions in the step's logits."""

    backend: ConstraintBackend
    masks: torch.Tensor
    rows: list[int]

    def apply(self, scores: torch.Tensor) -> None:
        """Sets the disallowed logits of the constrained rows to -inf, in place."""
        self.backend.apply_masks(scores, self.masks, self.rows)


class MaskFiller:
    def __init__(self, backend: ConstraintBackend) -> None:
        self.backend = backend
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="astrai-masks")
        self._masks = backend.allocate_masks(1)
        self._pending: Future[StepMasks] | None = None
        self.fill_seconds = 0.0  # time the worker spent filling
        self.wait_seconds = 0.0  # time the engine thread waited for it after the forward

    def start(self, matchers: Sequence[Matcher], rows: list[int], num_rows: int) -> None:
        """Begins filling: matchers[i] for logits row rows[i] of a step sampling num_rows."""
        if self._pending is not None:
            raise RuntimeError("a mask fill is already in flight; call wait() first")
        if len(matchers) != len(rows):
            raise ValueError(f"{len(matchers)} matchers for {len(rows)} rows")
        if num_rows > self._masks.shape[0]:
            self._masks = self.backend.allocate_masks(max(num_rows, 2 * self._masks.shape[0]))
        self._pending = self._pool.submit(self._fill, list(matchers), list(rows))

    def wait(self) -> StepMasks:
        if self._pending is None:
            raise RuntimeError("no mask fill in flight")
        started = time.perf_counter()
        pending, self._pending = self._pending, None
        masks = pending.result()
        self.wait_seconds += time.perf_counter() - started
        return masks

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _fill(self, matchers: list[Matcher], rows: list[int]) -> StepMasks:
        started = time.perf_counter()
        self.backend.fill_masks(matchers, self._masks, rows)
        self.fill_seconds += time.perf_counter() - started
        return StepMasks(self.backend, self._masks, rows)
