"""Tensor-parallel jobs from the command line: refusals before any rank starts, and ranks
that die or hang. Every failure ends the job with one line naming the rank and exit 1, leaves
no rank process behind, and keeps the checkpoint, from which a rerun finishes the job with
the output of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from jobs.jobkit import (
    comparable,
    engine_args,
    run_cli,
    saved_parts,
    shared_prefix_prompts,
    start_process,
    wait_for_parts,
    write_jsonl,
)

from astrai_batch.engine.model.spec import resolve_model_spec

ROWS = 40


def tp_args(model_dir: Path, source: Path, output: Path, *extra) -> list:
    """Greedy (so one rank and two give the same tokens), small windows, frequent saves."""
    return [
        "run",
        source,
        output,
        *engine_args(model_dir),
        "--max-tokens",
        "6",
        "--checkpoint-rows",
        "2",
        "--group-window",
        "10",
        "--max-num-seqs",
        "4",
        *extra,
    ]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(ROWS))]
    return write_jsonl(tmp_path_factory.mktemp("tp") / "in.jsonl", rows)


@pytest.fixture(scope="module")
def one_rank(tiny_llama_dir, source, tmp_path_factory) -> Path:
    """The job's output on one rank."""
    output = tmp_path_factory.mktemp("one") / "out.parquet"
    result = run_cli(*tp_args(tiny_llama_dir, source, output))
    assert result.exit_code == 0, result.stderr
    return output


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _rank_one(process, checkpoint: Path, parts: int) -> int:
    """Rank 1's pid, once the job has saved `parts` checkpoint parts."""
    wait_for_parts(process, checkpoint, parts, timeout=240)
    (worker,) = _children(process.pid)
    return worker


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- refusals: one line, exit 1, before any process starts ----------------------------------


def test_head_counts_that_do_not_split_are_refused(tiny_llama_dir, source, tmp_path):
    result = run_cli(
        *tp_args(tiny_llama_dir, source, tmp_path / "o.parquet"), "--tensor-parallel-size", 3
    )
    name = resolve_model_spec(tiny_llama_dir).name
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: --tensor-parallel-size 3 does not divide the heads of model {name!r}: "
        "4 query heads, 2 key/value heads (the size must divide the query heads, and divide "
        "or be a multiple of the key/value heads)\n"
    )


def test_a_model_without_a_plan_is_refused(tiny_llama_dir, source, tmp_path):
    model = tmp_path / "no-plan"
    shutil.copytree(tiny_llama_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "base_model_tp_plan": None}))
    result = run_cli(*tp_args(model, source, tmp_path / "o.parquet"), "--tensor-parallel-size", 2)
    name = resolve_model_spec(model).name
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: model {name!r} (llama) has no tensor-parallel plan in transformers "
        "(config.base_model_tp_plan); run it with --tensor-parallel-size 1\n"
    )


def test_ray_on_cuda_needs_a_gpu_per_rank(tiny_llama_dir, source, tmp_path):
    args = tp_args(tiny_llama_dir, source, tmp_path / "o.parquet")
    result = run_cli(
        *args,
        "--tensor-parallel-size",
        2,
        "--executor",
        "ray",
        "--workers",
        2,
        "--device",
        "cuda",
        "--worker-gpus",
        1,
    )
    assert result.exit_code == 2  # an option error, as every other combination refused
    assert result.stderr.splitlines()[-1] == (
        "Error: --executor ray with --tensor-parallel-size 2 needs --worker-gpus 2 (each "
        "worker's ranks run on its own GPUs), got 1"
    )


def test_ray_workers_of_two_ranks_each(tiny_llama_dir, source, one_rank, tmp_path, ray_address):
    """W engines of N ranks: each Ray worker starts its own ranks; the output is the one-rank
    local run's (greedy), and no rank outlives the job."""
    output = tmp_path / "ray.parquet"
    args = tp_args(tiny_llama_dir, source, output, "--tensor-parallel-size", 2)
    ray_options = ["--executor", "ray", "--ray-address", ray_address, "--workers", 2]
    result = run_cli(*args, *ray_options, "--worker-threads", 1)
    assert result.exit_code == 0, result.stderr

    def completions(path):  # prefix groups differ: the local run planned windows of 10 rows
        return [{k: v for k, v in row.items() if k != "prefix_group"} for row in comparable(path)]

    assert completions(output) == completions(one_rank)


# -- ranks that die or hang ------------------------------------------------------------------


def test_killed_rank_ends_the_job_and_a_rerun_resumes(tiny_llama_dir, source, one_rank, tmp_path):
    output = tmp_path / "out.parquet"
    checkpoint = tmp_path / ".out.parquet.ckpt"
    args = tp_args(tiny_llama_dir, source, output, "--tensor-parallel-size", 2)
    process = start_process(*args)
    worker = _rank_one(process, checkpoint, 2)
    os.kill(worker, signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.strip().splitlines()[-1] == (
        "Error: tensor-parallel rank 1 was killed by SIGKILL"
    )
    assert not _alive(worker)
    kept = saved_parts(checkpoint)
    assert kept >= 2 and not output.exists()
    # the rerun (two ranks again) resumes and ends with the one-rank job's rows
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["resumed_rows"] > 0
    assert comparable(output) == comparable(one_rank)


def test_stopped_rank_ends_the_job_within_the_timeout(tiny_llama_dir, source, tmp_path):
    checkpoint = tmp_path / ".out.parquet.ckpt"
    args = tp_args(
        tiny_llama_dir,
        source,
        tmp_path / "out.parquet",
        "--tensor-parallel-size",
        2,
        "--tp-timeout",
        6,
    )
    process = start_process(*args)
    worker = _rank_one(process, checkpoint, 1)
    os.kill(worker, signal.SIGSTOP)
    stopped = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert process.returncode == 1
    assert stderr.strip().splitlines()[-1] == (
        "Error: tensor-parallel rank 1 is stopped and did not answer within 6 s"
    )
    assert took < 6 + 30  # the timeout, then the job's exit (generous on a shared machine)
    assert _wait_gone(worker, 5)  # rank 0 killed it on its way out
    assert saved_parts(checkpoint) >= 1


def test_killed_rank_zero_takes_the_other_ranks_with_it(tiny_llama_dir, source, tmp_path):
    checkpoint = tmp_path / ".out.parquet.ckpt"
    args = tp_args(tiny_llama_dir, source, tmp_path / "out.parquet", "--tensor-parallel-size", 2)
    process = start_process(*args)
    worker = _rank_one(process, checkpoint, 1)
    process.kill()
    process.communicate(timeout=60)
    assert _wait_gone(worker, 10)


def test_the_toml_config_sets_the_ranks_and_the_size_is_a_result_option(tmp_path):
    from astrai_batch.jobs.options.config import JobConfig
    from astrai_batch.jobs.options.config_file import load_toml_options
    from astrai_batch.jobs.options.option_groups import RESULT_OPTIONS, RUN_OPTIONS

    path = tmp_path / "job.toml"
    path.write_text("tensor_parallel_size = 2\ntp_timeout = 30\n")
    config = JobConfig.from_options(load_toml_options(path))
    assert (config.tensor_parallel_size, config.tp_timeout) == (2, 30)
    assert "tensor_parallel_size" in RESULT_OPTIONS and "tp_timeout" in RUN_OPTIONS
