"""One job flow over two executors: what a job is (checks, checkpoint, exit status, the
final files) does not depend on the executor, and a checkpoint is never lost to the other.

Ray runs use the session's local Ray (`ray_address`); the process runs connect to it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import (
    engine_args,
    job_args,
    run_cli,
    shared_prefix_prompts,
    start_process,
    stop_after_parts,
    summary_of,
    write_jsonl,
)

from astrai_batch.jobs.executors.shard_store import ShardInfo, ShardStore
from astrai_batch.jobs.output.checkpoint import ExecutorMark
from astrai_batch.jobs.output.checkpoint_opening import open_checkpoint
from astrai_batch.jobs.output.records import part_schema
from astrai_batch.jobs.output.stats import WorkStats
from astrai_batch.jobs.planning.prefix_order import PlanningOptions

ray = pytest.importorskip("ray")


def ray_args(*extra: str, workers: int = 2) -> list[str]:
    return ["--executor", "ray", "--workers", str(workers), "--worker-threads", "1", *extra]


def rows_of(count: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(count))]


def snapshot(directory: Path) -> dict[str, int]:
    """Every file and its modification time; the run lock's file is the rerun's own."""
    return {str(p): p.stat().st_mtime_ns for p in sorted(directory.rglob("*")) if p.name != ".lock"}


def test_a_sampled_ray_run_draws_the_local_runs_tokens_and_writes_nothing_on_stderr(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows_of(12))
    sampled = [*engine_args(tiny_llama_dir), "--temperature", "0.9", "--seed", "5", "--n", "2"]
    local, sharded = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    assert run_cli("run", source, local, *sampled).exit_code == 0

    process = start_process(
        "run", source, sharded, *sampled, *ray_args("--ray-address", ray_address)
    )
    stdout, stderr = process.communicate(timeout=300)

    assert process.returncode == 0, stderr
    # --quiet: not one line of Ray's (its loggers, the core worker, workers, Ray Data). The
    # shared environment's torchao prints at import, which is not Ray's and not ours.
    assert [line for line in stderr.splitlines() if "ray" in line.lower()] == []
    assert summary_of(stdout)["status"] == "completed"
    expected = pq.read_table(local).drop_columns(["cached_tokens"]).to_pylist()
    assert pq.read_table(sharded).drop_columns(["cached_tokens"]).to_pylist() == expected


def test_ray_refuses_the_input_as_output_and_a_directory_as_output(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.parquet", rows_of(2))
    (tmp_path / "dir").mkdir()
    before = snapshot(tmp_path)

    same = run_cli("run", source, source, *engine_args(tiny_llama_dir), *ray_args())
    # a directory without --output-format is a parquet-dir output; named parquet, refused
    parquet = ("--output-format", "parquet")
    directory = run_cli(
        "run", source, tmp_path / "dir", *engine_args(tiny_llama_dir), *ray_args(), *parquet
    )

    assert (same.exit_code, same.stderr) == (1, f"Error: output {source} is the input file\n")
    assert (directory.exit_code, directory.stderr) == (
        1,
        f"Error: output {tmp_path / 'dir'} is a directory; give a file name\n",
    )
    assert snapshot(tmp_path) == before


def test_an_all_failed_ray_job_exits_1_like_a_local_one(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": i} for i in range(3)])
    results = {
        executor: run_cli(
            "run", source, tmp_path / f"{executor}.parquet", *engine_args(tiny_llama_dir), *extra
        )
        for executor, extra in (
            ("local", []),
            ("ray", ray_args("--ray-address", ray_address, workers=1)),
        )
    }

    for executor, result in results.items():
        summary = summary_of(result.stdout)
        assert (result.exit_code, summary["status"], summary["failed_rows"]) == (1, "failed", 3)
        assert summary["message"].startswith("all 3 rows failed; first error (row 0): "), executor


def test_ray_openai_output_takes_its_created_time_from_the_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import astrai_batch.jobs.output.checkpoint_manifest as checkpoint_module

    class CheckpointClock:  # the moment the checkpoint was created, long ago
        @staticmethod
        def time() -> float:
            return 1_000_000_000.0

    monkeypatch.setattr(checkpoint_module, "time", CheckpointClock)
    source = write_jsonl(tmp_path / "in.jsonl", rows_of(3))
    output = tmp_path / "out.jsonl"
    args = [*engine_args(tiny_llama_dir), "--output-format", "openai-jsonl"]

    result = run_cli(
        "run", source, output, *args, *ray_args("--ray-address", ray_address, workers=1)
    )

    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["response"]["body"]["created"] for line in lines] == [1_000_000_000] * 3


def test_a_local_checkpoint_is_refused_by_ray_and_kept(
    tiny_llama_dir: Path, job: dict[str, Path]
) -> None:
    args = job_args(tiny_llama_dir, job["source"], job["output"])
    code, _, _ = stop_after_parts(args, job["checkpoint"], 3, signal.SIGKILL)
    assert code == -signal.SIGKILL
    before = snapshot(job["checkpoint"])

    result = run_cli(*args, *ray_args())

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the checkpoint in {job['checkpoint']} holds rows finished by --executor "
        "local; rerun with --executor local to resume it, or rerun with --restart to discard "
        "it and start over\n"
    )
    assert snapshot(job["checkpoint"]) == before


def test_a_ray_checkpoint_is_refused_by_a_local_run_and_kept(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows_of(4))
    output = tmp_path / "out.parquet"
    directory = tmp_path / ".out.parquet.ckpt"
    # What a killed Ray driver leaves: its manifest and one committed shard part.
    checkpoint = open_checkpoint(
        directory,
        {"job": "ray"},
        planning=PlanningOptions(16, True, 100),
        restart=False,
        executor=ExecutorMark("ray", 2, 1),
    )
    store = ShardStore(checkpoint.directory, checkpoint.run_id, 2)
    empty = pa.Table.from_pylist([], schema=part_schema(pa.schema([])))
    store.write(empty, ShardInfo(0, WorkStats(input_rows=2), 1, {"name": "tiny"}))
    before = snapshot(directory)

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the checkpoint in {directory} holds rows finished by --executor ray "
        "--workers 2; rerun with --executor ray --workers 2 to resume it, or rerun with "
        "--restart to discard it and start over\n"
    )
    assert snapshot(directory) == before
    assert not output.exists()


def test_an_empty_checkpoint_is_taken_over_by_the_other_executor(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows_of(3))
    output = tmp_path / "out.parquet"
    open_checkpoint(
        tmp_path / ".out.parquet.ckpt",
        {"job": "ray"},
        planning=PlanningOptions(16, True, 100),
        restart=False,
        executor=ExecutorMark("ray", 2, 1),
    )

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))

    assert result.exit_code == 0, result.stderr
    assert pq.read_table(output).column("id").to_pylist() == ["r0", "r1", "r2"]
    assert not (tmp_path / ".out.parquet.ckpt").exists()
