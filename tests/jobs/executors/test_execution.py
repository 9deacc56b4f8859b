"""The running part of a job, driven directly: when finished rows are saved, and what."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import pytest
from jobs.jobkit import question, write_jsonl

from astrai_batch.engine import load_model
from astrai_batch.io import open_input
from astrai_batch.jobs.executors.local_execution import JobExecution
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.checkpoint_opening import open_checkpoint
from astrai_batch.jobs.output.records import part_schema
from astrai_batch.jobs.progress import Progress


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir: Path):
    return load_model(tiny_llama_dir)


def execute(loaded, tmp_path: Path, clock=None, **options) -> tuple[JobExecution, Checkpoint]:
    source = open_input(
        write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(10)])
    )
    config = JobConfig.from_options(
        {"max_tokens": 2, "kv_cache_memory": "8MiB", "group_window": 4, **options}
    )
    checkpoint = open_checkpoint(
        tmp_path / ".ckpt", {"job": 1}, planning=config.planning_options(), restart=False
    )
    extra = {} if clock is None else {"clock": clock}
    execution = JobExecution(
        config=config,
        loaded=loaded,
        source=source,
        checkpoint=checkpoint,
        schema=part_schema(source.kept_schema()),
        total_rows=10,
        progress=Progress(),
        **extra,
    )
    result = anyio.run(execution.run)
    assert result.signum is None
    assert result.run_stats.input_rows == 10
    execution.check_invariants()
    checkpoint.check_invariants()
    return execution, checkpoint


def part_rows(checkpoint: Checkpoint) -> list[tuple[int, int]]:
    """(window, input rows) of each saved part, in saving order."""
    return [(p.window, p.stats.input_rows) for p in checkpoint.parts()]


def test_rows_are_saved_every_checkpoint_rows_and_at_each_window_end(
    loaded, tmp_path: Path
) -> None:
    _, checkpoint = execute(loaded, tmp_path, checkpoint_rows=3)
    assert part_rows(checkpoint) == [(0, 3), (0, 1), (1, 3), (1, 1), (2, 2)]
    assert [checkpoint.window(k).rows for k in range(3)] == [4, 4, 2]
    assert checkpoint.first_incomplete_window() == 3
    assert checkpoint.done_indices(1) == {4, 5, 6, 7}


def test_rows_are_saved_every_checkpoint_seconds(loaded, tmp_path: Path) -> None:
    ticks = itertools.count(step=100.0)  # every reading of the clock is 100 s later
    _, checkpoint = execute(loaded, tmp_path, clock=lambda: next(ticks))
    assert part_rows(checkpoint) == [(0, 1)] * 4 + [(1, 1)] * 4 + [(2, 1)] * 2


def test_finished_rows_leave_no_images_in_their_window(tmp_path: Path) -> None:
    """Rows with data URL images, 3 windows of 2 rows: once the job is done, the window it
    ran last holds no row's images (each released as its row finished), and the rows ran."""
    from vision_kit import png_data_url, random_image, save_tiny_llava

    llava = load_model(save_tiny_llava(tmp_path / "llava"))
    lines = [
        {"id": f"r{i}", "prompt": f"What is {i}?", "img": png_data_url(random_image(60 + i))}
        for i in range(6)
    ]
    source = open_input(write_jsonl(tmp_path / "in.jsonl", lines), image_column="img")
    config = JobConfig.from_options(
        {"max_tokens": 1, "kv_cache_memory": "8MiB", "group_window": 2, "image_column": "img"}
    )
    checkpoint = open_checkpoint(
        tmp_path / ".ckpt", {"job": 1}, planning=config.planning_options(), restart=False
    )
    execution = JobExecution(
        config=config,
        loaded=llava,
        source=source,
        checkpoint=checkpoint,
        schema=part_schema(source.kept_schema()),
        total_rows=6,
        progress=Progress(),
    )
    result = anyio.run(execution.run)
    assert (result.run_stats.input_rows, result.run_stats.failed_rows) == (6, 0)
    last = execution._window
    assert last is not None and last.number == 2
    assert [(row.index, row.error, row.images) for row in last.rows] == [
        (4, None, ()),
        (5, None, ()),
    ]
