"""The job's time series (`jobs/output/timeline`): bounded however long the job runs, counts
kept when points merge, continued across a resume, written into the stats file's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import killed_part_way, run_cli, shared_prefix_prompts, write_jsonl

from astrai_batch.engine.types import CacheStats, EngineStats
from astrai_batch.jobs.output.timeline import (
    FIRST_INTERVAL,
    TIMELINE_KEY,
    Timeline,
    TimelinePoint,
    TimelineRecorder,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def engine_stats(steps: int, decode: int, in_use: int = 0, cached: int = 0) -> EngineStats:
    return EngineStats(
        steps=steps,
        prefill_tokens=0,
        decode_tokens=decode,
        preemptions=0,
        requests_finished=0,
        requests_failed=0,
        forward_seconds=0.0,
        busy_seconds=0.0,
        cache=CacheStats(pages_in_use=in_use, cached_pages=cached),
    )


def run_recorder(
    recorder: TimelineRecorder, clock: Clock, samples: int, seed_steps: int = 0
) -> tuple[int, int]:
    """`samples` stretches of 0.7 s, each 3 steps of 5 tokens; returns (steps, tokens)."""
    steps = decode = 0
    recorder.begin(engine_stats(seed_steps, seed_steps * 5))
    for i in range(samples):
        clock.now += 0.7
        steps += 3
        decode += 15
        recorder.observe(CacheStats(pages_in_use=i % 50, cached_pages=i % 7))
        recorder.sample(
            engine_stats(seed_steps + steps, (seed_steps + steps) * 5, 0, 0), i, force=True
        )
    return steps, decode


@pytest.mark.parametrize("samples", [1, 7, 239, 240, 241, 5000])
def test_series_stays_bounded_and_keeps_every_token(samples: int) -> None:
    clock = Clock()
    recorder = TimelineRecorder(None, kv_pages=64, max_num_seqs=8, clock=clock)
    steps, decode = run_recorder(recorder, clock, samples)
    points = recorder.timeline().points
    assert len(points) <= 240
    assert sum(p.decode_tokens for p in points) == decode
    assert sum(p.steps for p in points) == steps
    assert sum(p.seconds for p in points) == pytest.approx(0.7 * samples)
    assert points[-1].end == pytest.approx(0.7 * samples)
    assert [p.end for p in points] == sorted(p.end for p in points)
    assert points[-1].rows == samples - 1
    # a merged point keeps the highest gauge of its stretch
    assert max(p.kv_pages_in_use for p in points) == min(samples - 1, 49)
    assert all(p.batch == 5.0 for p in points)
    # each merge halves the series and doubles the interval
    assert (recorder.interval > FIRST_INTERVAL) == (samples > 240)
    assert len(points) * recorder.interval / FIRST_INTERVAL >= samples


def test_samples_wait_for_the_interval_unless_forced() -> None:
    clock = Clock()
    recorder = TimelineRecorder(None, kv_pages=64, max_num_seqs=8, clock=clock)
    recorder.begin(engine_stats(0, 0))
    clock.now += FIRST_INTERVAL / 2
    assert not recorder.is_due()
    recorder.sample(engine_stats(1, 4), 1)
    assert recorder.timeline().points == ()
    clock.now += FIRST_INTERVAL / 2
    assert recorder.is_due()
    recorder.sample(engine_stats(2, 8), 2)
    assert recorder.timeline().points[0].decode_tokens == 8


def test_a_resumed_run_continues_the_series() -> None:
    clock = Clock()
    first = TimelineRecorder(None, kv_pages=64, max_num_seqs=8, clock=clock)
    run_recorder(first, clock, 10)
    saved = Timeline.from_json(first.timeline().to_json())
    assert saved == first.timeline()
    clock.now += 500.0  # the time between the kill and the rerun is not the job's
    second = TimelineRecorder(saved, kv_pages=64, max_num_seqs=8, clock=clock)
    run_recorder(second, clock, 5, seed_steps=1000)  # a new engine's counters start anew
    points = second.timeline().points
    assert [p.run for p in points] == [0] * 10 + [1] * 5
    assert points[-1].end == pytest.approx(0.7 * 15)
    assert sum(p.decode_tokens for p in points) == 15 * 15


def test_a_damaged_timeline_is_refused() -> None:
    good = Timeline(64, 8, 0.5, 10, (TimelinePoint(0, 1.0, 1.0, 3, 4, 2, 1, 1),)).to_dict()
    assert Timeline.checkpointed(good) is not None
    assert Timeline.checkpointed(None) is None
    for bad in (
        {**good, "extra": 1},
        {**good, "points": [[0, 1.0, 1.0, 3, 4]]},
        {**good, "points": [[0, 1.0, 1.0, 3, -4, 2, 1, 1]]},
        {**good, "format": 99},
        [],
    ):
        with pytest.raises(ValueError):
            Timeline.checkpointed(bad)


ROWS = 48


def stats_timeline(output: Path) -> tuple[Timeline, dict]:
    stats = output.with_name(output.name.replace(".parquet", ".stats.parquet"))
    metadata = pq.read_schema(stats).metadata
    total = pq.read_table(stats).to_pylist()[-1]
    return Timeline.from_json(metadata[TIMELINE_KEY.encode()].decode()), total


def test_a_resumed_job_records_both_runs_in_its_stats(tiny_llama_dir, tmp_path) -> None:
    """Killed part-way and rerun: the series holds both runs, in job time, and its token
    count is exactly the stats file's (both are saved with each checkpoint part)."""
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(ROWS))]
    # 4-row parts in 40-row windows (jobkit.job_args): the kill lands after 12 of 48 rows
    job = {
        "source": write_jsonl(tmp_path / "in.jsonl", rows),
        "output": tmp_path / "out.parquet",
        "checkpoint": tmp_path / ".out.parquet.ckpt",
    }
    args, saved = killed_part_way(tiny_llama_dir, job)
    manifest = json.loads((job["checkpoint"] / "manifest.json").read_text())
    assert Timeline.checkpointed(manifest["timeline"]).points[-1].rows == saved
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    timeline, total = stats_timeline(job["output"])
    assert {p.run for p in timeline.points} == {0, 1}
    assert timeline.points[-1].rows == ROWS
    assert sum(p.decode_tokens for p in timeline.points) == total["decode_tokens"]
    assert timeline.peak_rss_bytes > 0 and timeline.kv_pages > 0
    ends = [p.end for p in timeline.points]
    assert ends == sorted(ends)
