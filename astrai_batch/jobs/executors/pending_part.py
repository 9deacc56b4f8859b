"""The finished records of the current window not yet in the checkpoint, and when they become
its next part: every `checkpoint_rows` rows, every `checkpoint_seconds` seconds, and (the
caller's call) at the end of each window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from astrai_batch.engine.types import EngineStats
from astrai_batch.errors import AstraiBatchError
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.records import INDEX_COLUMN, records_table
from astrai_batch.jobs.output.stats import WorkStats, engine_stats, records_stats


class PendingPart:
    """A part's statistics carry the engine's counters since the previous part (`begin` sets
    the first baseline), so the parts of a run add up to the run."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        schema: pa.Schema,
        *,
        every_rows: int,
        every_seconds: float,
        clock: Callable[[], float],
        started: float,
    ) -> None:
        self.checkpoint = checkpoint
        self.schema = schema
        self.every_rows = every_rows
        self.every_seconds = every_seconds
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self.rows = 0
        self.saved = WorkStats()  # every part this run saved, together
        self._last_save = started
        self._engine_before: EngineStats | None = None

    def begin(self, engine_before: EngineStats) -> None:
        self._engine_before = engine_before

    def add(self, records: list[dict[str, Any]]) -> None:
        """The records (one per sample) of one finished row."""
        self.records.extend(records)
        self.rows += 1

    def is_due(self) -> bool:
        return self.rows >= self.every_rows or (
            bool(self.records) and self.clock() - self._last_save >= self.every_seconds
        )

    def save(self, window: int, engine_after: EngineStats) -> None:
        """Write the records as a part of `window` (they must belong to it), then start over."""
        now = self.clock()
        before = self._engine_before or engine_after
        stats = records_stats(self.records) + engine_stats(
            before, engine_after, now - self._last_save
        )
        self.checkpoint.write_part(window, records_table(self.records, self.schema), stats)
        self.saved = self.saved + stats
        self.records = []
        self.rows = 0
        self._last_save = now
        self._engine_before = engine_after

    def check_invariants(self) -> None:
        """One first-sample record per pending row, no row twice."""
        indices = [r[INDEX_COLUMN] for r in self.records if r["sample_index"] == 0]
        if len(indices) != self.rows or len(set(indices)) != len(indices):
            raise AstraiBatchError(f"{self.rows} rows pending but records hold {len(indices)} rows")
