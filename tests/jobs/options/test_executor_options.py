"""The executor options: refused where they mean nothing, and the CPU share of Ray actors."""

from __future__ import annotations

import pytest
from jobs.jobkit import run_cli, write_jsonl

from astrai_batch.errors import ConfigError
from astrai_batch.jobs.executors.ray_job import actor_cpus
from astrai_batch.jobs.options.config import JobConfig


def test_ray_options_need_the_ray_executor(tmp_path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])

    result = run_cli("run", source, tmp_path / "out.parquet", "--workers", "2")

    assert result.exit_code == 2
    assert (
        "Error: ray_address, workers, worker_threads and worker_gpus need --executor ray"
        in result.stderr
    )
    assert list(tmp_path.iterdir()) == [source]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"executor": "spark"}, "executor must be local or ray, got 'spark'"),
        ({"executor": "ray", "workers": 0}, "workers must be >= 1, got 0"),
        ({"executor": "ray", "worker_gpus": -1}, "worker_gpus must be a number >= 0, got -1"),
    ],
)
def test_bad_executor_options_are_refused(options, message) -> None:
    with pytest.raises(ConfigError) as raised:
        JobConfig.from_options(options)
    assert str(raised.value) == message


def test_executor_options_do_not_block_a_resume() -> None:
    local = JobConfig.from_options({})
    sharded = JobConfig.from_options({"executor": "ray", "workers": 4, "worker_threads": 2})
    assert local.result_options() == sharded.result_options()


@pytest.mark.parametrize(
    ("cpus", "workers", "threads", "ranks", "share"),
    [
        (2, 2, 1, 1, 0.5),  # too small: one CPU left to Ray Data's tasks, the other shared
        (16, 4, 2, 1, 2.0),  # room for every thread and a spare core
        (4, 4, 1, 1, 0.75),
        (1, 1, 1, 1, 0.5),
        (16, 2, 2, 3, 6.0),  # three ranks of two threads each: the engine's three bundles
        (16, 4, 2, 2, 3.75),  # 4 x 4 does not fit beside a spare core: shared
    ],
)
def test_actors_leave_a_core_to_ray_data_on_small_machines(cpus, workers, threads, ranks, share):
    assert actor_cpus(cpus, workers, threads, ranks) == share


def test_file_uris_work_and_a_uri_pyarrow_cannot_open_is_refused_in_one_line(
    tiny_llama_dir, tmp_path
) -> None:
    from jobs.jobkit import engine_args

    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    for arguments, uri in (
        (("nosuch://KEY:SECRET@bucket/in.jsonl", tmp_path / "out.parquet"), "bucket/in.jsonl"),
        ((source, "nosuch://KEY:SECRET@bucket/out.parquet"), "bucket/out.parquet"),
    ):
        refused = run_cli("run", *arguments, "--quiet")
        assert refused.exit_code == 1
        # Named without the keys, also where pyarrow's own message repeats the URI.
        assert refused.stderr == (
            f"Error: cannot open nosuch://{uri}: Unrecognized filesystem type in URI: "
            f"nosuch://{uri}\n"
        )
    assert list(tmp_path.iterdir()) == [source]
    result = run_cli(
        "run", f"file://{source}", f"file://{tmp_path}/out.parquet", *engine_args(tiny_llama_dir)
    )
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out.parquet").exists()
