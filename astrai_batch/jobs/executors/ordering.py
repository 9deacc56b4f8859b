"""Putting results back together: the engine yields samples as they finish, in any order.

`SampleCollector` holds the samples of rows still generating and releases a row once all of
its samples are in. Input order is restored when the output is assembled, window by window
(see `output.part_tables`): checkpoint parts keep rows in finishing order, so a part can be
saved at any moment without waiting for the slowest row of the window.
"""

from __future__ import annotations

from collections.abc import Hashable

from astrai_batch.engine.types import GenerationResult
from astrai_batch.errors import AstraiBatchError


class SampleCollector:
    """Gathers the `expected` samples of each request id."""

    def __init__(self) -> None:
        self._samples: dict[Hashable, list[GenerationResult]] = {}

    def add(self, result: GenerationResult, expected: int) -> list[GenerationResult] | None:
        """Store a sample; returns all of the row's samples (by sample index) once complete."""
        if expected < 1:
            raise AstraiBatchError(f"request {result.request_id!r} expects {expected} samples")
        samples = self._samples.setdefault(result.request_id, [])
        if any(sample.sample_index == result.sample_index for sample in samples):
            raise AstraiBatchError(
                f"request {result.request_id!r} returned sample {result.sample_index} twice"
            )
        samples.append(result)
        if len(samples) < expected:
            return None
        del self._samples[result.request_id]
        return sorted(samples, key=lambda sample: sample.sample_index)

    @property
    def pending_requests(self) -> int:
        """Requests with some but not all samples in."""
        return len(self._samples)

    def check_invariants(self) -> None:
        for request_id, samples in self._samples.items():
            indices = [sample.sample_index for sample in samples]
            if not samples or len(set(indices)) != len(indices):
                raise AstraiBatchError(f"request {request_id!r} holds samples {indices}")
