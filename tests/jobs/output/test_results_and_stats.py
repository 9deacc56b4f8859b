"""From engine results to records, and from records to statistics, progress and summary."""

from __future__ import annotations

import dataclasses
import io
import json

import pyarrow as pa
import pytest

from astrai_batch.cache import CacheStats
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import EngineStats, GenerationResult
from astrai_batch.errors import AstraiBatchError
from astrai_batch.io import STATS_SCHEMA
from astrai_batch.jobs.executors.ordering import SampleCollector
from astrai_batch.jobs.output.records import (
    INDEX_COLUMN,
    PROMPT_COLUMN,
    error_record,
    part_schema,
    records_table,
    row_records,
)
from astrai_batch.jobs.output.stats import WorkStats, engine_stats, records_stats, stats_table
from astrai_batch.jobs.planning.window import PreparedRow, line_sample, row_requests
from astrai_batch.jobs.progress import LogProgress, Progress, ProgressSnapshot, make_progress
from astrai_batch.jobs.summary import JobSummary


def result(request_id: int, sample: int, tokens: int = 2, **changes) -> GenerationResult:
    values = dict(
        request_id=request_id,
        sample_index=sample,
        token_ids=tuple(range(tokens)),
        text="x" * tokens,
        finish_reason="length",
        prompt_tokens=10,
        cached_tokens=8,
        completion_tokens=tokens,
    )
    values.update(changes)
    return GenerationResult(**values)


def runnable(index: int, n: int = 1, group: int = 0) -> PreparedRow:
    return PreparedRow(
        index, f"id-{index}", "c", "chat", {"k": "v"}, (1, 2), SamplingParams(n=n), None, group
    )


def test_sample_collector_releases_a_row_when_all_samples_are_in() -> None:
    collector = SampleCollector()
    assert collector.add(result(7, 1), expected=2) is None
    assert collector.pending_requests == 1
    collector.check_invariants()
    samples = collector.add(result(7, 0), expected=2)
    assert [s.sample_index for s in samples or []] == [0, 1]
    assert collector.pending_requests == 0
    assert collector.add(result(8, 0), expected=1) == [result(8, 0)]
    collector.add(result(9, 0), expected=2)
    with pytest.raises(AstraiBatchError, match="request 9 returned sample 0 twice"):
        collector.add(result(9, 0), expected=2)


def test_row_records_one_per_sample_or_one_error() -> None:
    row = runnable(3, n=2, group=5)
    records = row_records(row, [result(3, 1, 3), result(3, 0, 2)])
    assert [(r["sample_index"], r["completion"], r["completion_tokens"]) for r in records] == [
        (0, "xx", 2),
        (1, "xxx", 3),
    ]
    assert records[0]["prefix_group"] == 5 and records[0]["k"] == "v"
    assert records[0][INDEX_COLUMN] == 3 and records[0]["completion_token_ids"] == [0, 1]

    failed = [
        result(3, i, 0, finish_reason="error", error="too long", cached_tokens=0) for i in (0, 1)
    ]
    (record,) = row_records(row, failed)
    assert (record["finish_reason"], record["error"], record["sample_index"]) == (
        "error",
        "too long",
        0,
    )
    assert (record["prompt_tokens"], record["cached_tokens"], record["completion"]) == (
        None,
        None,
        None,
    )
    with pytest.raises(AstraiBatchError, match="row 3 has 1 samples, expected 2"):
        row_records(row, [result(3, 0)])


def test_a_row_of_several_prompts_is_one_request_each_and_completes_once_all_are_in() -> None:
    row = dataclasses.replace(runnable(4, n=2), kind="completion", extra_token_ids=((7,), (8, 9)))
    requests = row_requests(row)
    assert [(r.request_id, tuple(r.prompt_token_ids)) for r in requests] == [
        (4, (1, 2)),
        ((4, 1), (7,)),
        ((4, 2), (8, 9)),
    ]
    assert [r.seed_key for r in requests] == ["id-4", ("id-4", 1), ("id-4", 2)]
    collector = SampleCollector()
    finished = None
    for request_id in ((4, 2), 4, (4, 1)):
        for sample in (1, 0):
            assert finished is None  # a row is released only once all 6 samples are in
            finished = collector.add(line_sample(row, result(request_id, sample)), 6)
    assert [s.sample_index for s in finished or []] == [0, 1, 2, 3, 4, 5]
    records = row_records(row, finished or [])
    assert [(r["sample_index"], r[PROMPT_COLUMN]) for r in records] == [
        (0, 0),
        (1, 0),
        (2, 1),
        (3, 1),
        (4, 2),
        (5, 2),
    ]
    records_table(records, part_schema(pa.schema([pa.field("k", pa.string())])))
    # one prompt failing fails the line, naming the prompt
    failing = [
        dataclasses.replace(s, finish_reason="error", error="too long")
        if s.sample_index >= 4
        else s
        for s in finished or []
    ]
    (record,) = row_records(row, failing)
    assert record["error"] == "prompt 2: too long"


def test_records_fit_the_part_schema() -> None:
    schema = part_schema(pa.schema([pa.field("k", pa.string())]))
    records = row_records(runnable(0), [result(0, 0)])
    records.append(error_record(runnable(1), "bad"))
    table = records_table(records, schema)
    assert table.schema == schema
    assert table.column("error").to_pylist() == [None, "bad"]


def test_records_stats_count_input_rows_once() -> None:
    records = row_records(runnable(0, n=2), [result(0, 0, 2), result(0, 1, 3)])
    records.append(error_record(runnable(1), "bad"))
    assert records_stats(records) == WorkStats(
        input_rows=2,
        output_rows=3,
        failed_rows=1,
        prompt_tokens=20,
        cached_tokens=16,
        completion_tokens=5,
    )


def engine_snapshot(scale: int, peak: int) -> EngineStats:
    return EngineStats(
        steps=scale,
        prefill_tokens=10 * scale,
        decode_tokens=3 * scale,
        preemptions=scale,
        requests_finished=scale,
        requests_failed=0,
        forward_seconds=0.1 * scale,
        busy_seconds=0.2 * scale,
        cache=CacheStats(evicted_pages=2 * scale, peak_pages_in_use=peak),
    )


def test_engine_stats_between_snapshots() -> None:
    stats = engine_stats(engine_snapshot(1, 4), engine_snapshot(3, 9), wall_seconds=2.0)
    assert stats == WorkStats(
        prefill_tokens_computed=20,
        decode_tokens=6,
        evicted_pages=4,
        preemptions=2,
        peak_kv_pages=9,
        wall_seconds=2.0,
    )
    assert stats.tokens_per_second == 3.0


def test_stats_table_has_a_row_per_window_and_a_total() -> None:
    first = WorkStats(
        input_rows=2,
        prompt_tokens=100,
        cached_tokens=50,
        decode_tokens=8,
        peak_kv_pages=7,
        wall_seconds=2.0,
    )
    second = WorkStats(
        input_rows=1,
        prompt_tokens=60,
        cached_tokens=10,
        decode_tokens=4,
        peak_kv_pages=5,
        wall_seconds=2.0,
    )
    table = stats_table({1: second, 0: first})
    assert table.schema == STATS_SCHEMA
    rows = table.to_pylist()
    assert [(r["window"], r["is_total"], r["rows"]) for r in rows] == [
        (0, False, 2),
        (1, False, 1),
        (None, True, 3),
    ]
    total = rows[-1]
    assert (total["prompt_tokens"], total["cached_tokens"], total["hit_rate"]) == (
        160,
        60,
        60 / 160,
    )
    assert (total["peak_kv_pages"], total["wall_seconds"], total["tokens_per_second"]) == (
        7,
        4.0,
        3.0,
    )
    assert WorkStats.from_dict(first.to_dict()) == first


def test_progress_lines() -> None:
    snapshot = ProgressSnapshot(
        rows_done=250,
        total_rows=1000,
        rows_this_run=200,
        generated_tokens=900,
        prompt_tokens=4000,
        cached_tokens=3000,
        elapsed_seconds=10.0,
    )
    assert snapshot.eta_seconds == 37.5
    assert snapshot.line() == (
        "astrai-batch: 250/1000 rows (25.0%), 90.0 generated tok/s, cache hit 75.0%, ETA 0:00:38"
    )
    # Before a row of this run finished there is no rate to base an ETA on: none is shown.
    first = dataclasses.replace(snapshot, rows_done=50, rows_this_run=0)
    assert first.eta_seconds is None
    assert dataclasses.replace(snapshot, generated_tokens=0).eta_seconds is None
    assert first.line() == (
        "astrai-batch: 50/1000 rows (5.0%), 90.0 generated tok/s, cache hit 75.0%"
    )
    now = [0.0]
    stream = io.StringIO()
    progress = LogProgress(stream, interval=30.0, clock=lambda: now[0])
    progress.message("loading model m")
    progress.update(snapshot)  # too soon for a line
    now[0] = 31.0
    progress.update(snapshot)
    now[0] = 40.0
    progress.update(snapshot)
    progress.close()
    progress.close()
    assert stream.getvalue().splitlines() == [
        "astrai-batch: loading model m",
        snapshot.line(),
        snapshot.line(),
    ]


def test_make_progress_picks_the_reporter() -> None:
    assert type(make_progress(io.StringIO(), quiet=True, interval=1.0)) is Progress
    assert type(make_progress(io.StringIO(), quiet=False, interval=1.0)) is LogProgress


def test_summary_json() -> None:
    summary = JobSummary(
        status="completed",
        exit_code=0,
        input="in.jsonl",
        output="out.parquet",
        stats_output="out.stats.parquet",
        output_format="parquet",
        model="m",
        total_rows=3,
        totals=WorkStats(
            input_rows=3, output_rows=3, prompt_tokens=30, cached_tokens=15, completion_tokens=12
        ),
        resumed_rows=1,
        run_decode_tokens=8,
        run_wall_seconds=2.0,
        run_generation_seconds=0.5,
        threads=2,
    )
    data = json.loads(summary.to_json())
    assert data["cache_hit_rate"] == 0.5 and data["tokens_per_second"] == 4.0
    # the same tokens over the time spent running rows, named apart from the wall rate
    assert (data["generation_seconds"], data["generation_tokens_per_second"]) == (0.5, 16.0)
    assert data["threads"] == 2
    assert (data["rows"], data["rows_done"], data["resumed_rows"]) == (3, 3, 1)
    with pytest.raises(ValueError, match="status must be one of"):
        JobSummary(**{**summary.__dict__, "status": "done"})
