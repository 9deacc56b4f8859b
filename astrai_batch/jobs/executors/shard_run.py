"""One shard through one engine: the rows a worker was given, ordered and generated.

The worker orders its rows exactly as the local runner orders a window (`plan_window`:
sorted token ids with grouping on, input order with it off) and keeps the prefix-group
numbers the driver gave them, so a row's record is the record a local run writes for it.
Rows that failed before planning get their error record without reaching the engine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from astrai_batch.engine import Engine, EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.errors import AstraiBatchError
from astrai_batch.jobs.executors.ordering import SampleCollector
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.records import error_record, row_records
from astrai_batch.jobs.output.response_parsing import ResponseParsing
from astrai_batch.jobs.output.stats import WorkStats, engine_stats, records_stats
from astrai_batch.jobs.planning.prefix_order import plan_window
from astrai_batch.jobs.planning.window import (
    PreparedRow,
    line_sample,
    request_row,
    row_requests,
)


@dataclass(frozen=True)
class ShardResult:
    records: list[dict[str, Any]]  # one per (row, sample), in input order
    stats: WorkStats


def shard_requests(rows: Sequence[PreparedRow], page_size: int, grouping: bool) -> list[int]:
    """Positions in `rows` of the runnable rows, in the order the engine gets them."""
    runnable = [p for p, row in enumerate(rows) if row.token_ids is not None]
    plan = plan_window(
        [rows[p].token_ids or () for p in runnable],
        page_size=page_size,
        enable_grouping=grouping,
        adapters=[rows[p].adapter for p in runnable],
    )
    return [runnable[p] for p in plan.order]


def run_shard(loaded: LoadedModel, config: JobConfig, rows: Sequence[PreparedRow]) -> ShardResult:
    """Generate every row of the shard (blocking; one engine for the whole shard)."""
    return anyio.run(_run_shard, loaded, config, list(rows))


async def _run_shard(
    loaded: LoadedModel, config: JobConfig, rows: list[PreparedRow]
) -> ShardResult:
    started = time.monotonic()
    records: dict[int, list[dict[str, Any]]] = {
        row.index: [error_record(row, row.error)] for row in rows if row.error is not None
    }
    by_index = {row.index: row for row in rows}
    if len(by_index) != len(rows):
        raise AstraiBatchError("a shard holds the same input row twice")
    order = shard_requests(rows, config.page_size, config.grouping)
    # The local run's requests (`row_requests`: seeded by the row id, a score row's
    # continuations, an embed row's pooling): a row's result is the same whichever executor
    # and shard run it.
    requests = [request for p in order for request in row_requests(rows[p])]
    collector = SampleCollector()
    parsing = ResponseParsing(config.tool_call_parser, config.reasoning_parser, loaded.tokenizer)
    async with Engine(loaded, EngineConfig(**config.engine_options())) as engine:
        before = engine.stats()
        results = engine.generate(requests)
        async with contextlib.aclosing(results):  # type: ignore[type-var]
            async for result in results:
                row = by_index[request_row(result.request_id)[0]]
                samples = collector.add(line_sample(row, result), row.num_samples)
                if samples is not None:
                    records[row.index] = row_records(row, samples, parsing)
        after = engine.stats()
    if len(records) != len(rows):
        raise AstraiBatchError(f"the shard finished {len(records)} of {len(rows)} rows")
    ordered = [record for index in sorted(records) for record in records[index]]
    stats = records_stats(ordered) + engine_stats(before, after, time.monotonic() - started)
    return ShardResult(ordered, stats)
