"""`--executor ray` on a local Ray (2 CPUs), 2 workers x 1 thread, with the tiny model:
the output equals the local run's row for row, prefix groups stay whole, a killed worker
and a killed driver lose no row and write none twice."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import (
    SYSTEM_PROMPTS,
    engine_args,
    question,
    run_cli,
    shared_prefix_prompts,
    start_process,
    summary_of,
    write_jsonl,
)

ray = pytest.importorskip("ray")

# Columns a row's result decides alone (cached_tokens depends on what ran before it).
RESULT_COLUMNS = [
    "id",
    "sample_index",
    "completion",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "prefix_group",
    "error",
]


def ray_args(*extra: str) -> list[str]:
    return ["--executor", "ray", "--workers", "2", "--worker-threads", "1", *extra]


def mixed_rows(count: int) -> list[dict]:
    rows = [{"id": f"row-{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(count))]
    rows[5] = {"id": "row-5", "prompt": 17}  # not a string: a row error before planning
    rows[9] = {"id": "row-9", "prompt": rows[9]["prompt"], "temperature": -1}  # bad override
    return rows


def test_ray_output_equals_local_run_and_groups_stay_whole(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", mixed_rows(30))
    local, sharded = tmp_path / "local.parquet", tmp_path / "ray.parquet"

    first = run_cli("run", source, local, *engine_args(tiny_llama_dir))
    second = run_cli("run", source, sharded, *engine_args(tiny_llama_dir), *ray_args())

    assert first.exit_code == 0, first.stderr
    assert second.exit_code == 0, second.stderr
    summary = summary_of(second.stdout)
    assert (summary["status"], summary["rows"], summary["failed_rows"]) == (
        "completed_with_errors",
        30,
        2,
    )
    expected, got = pq.read_table(local), pq.read_table(sharded)
    assert got.schema == expected.schema
    assert set(got.schema.metadata) == set(expected.schema.metadata)
    assert got.select(RESULT_COLUMNS).to_pylist() == expected.select(RESULT_COLUMNS).to_pylist()
    assert got.column("id").to_pylist() == [f"row-{i}" for i in range(30)]
    errors = {r["id"]: r["error"] for r in got.to_pylist() if r["error"] is not None}
    assert set(errors) == {"row-5", "row-9"}
    assert not list(tmp_path.glob(".ray.parquet.ckpt"))

    stats_path = tmp_path / "ray.stats.parquet"
    stats = pq.read_table(stats_path).to_pylist()
    assert [(s["window"], s["is_total"]) for s in stats] == [(0, False), (1, False), (None, True)]
    assert sum(s["rows"] for s in stats[:2]) == stats[2]["rows"] == 30
    shards = json.loads(pq.read_schema(stats_path).metadata[b"astrai_batch.shards"])
    groups = {g for g in got.column("prefix_group").to_pylist() if g is not None}
    # A group split over two shards would be counted by both.
    assert sum(shard["prefix_groups"] for shard in shards) == len(groups) == 3
    assert all(shard["prefix_groups"] >= 1 for shard in shards)


def shard_worker_actors() -> dict[str, dict]:
    from ray._private import state

    return {
        actor_id: info
        for actor_id, info in state.actors().items()
        if "ShardWorker" in info["ActorClassName"]
    }


def test_a_killed_worker_is_restarted_and_every_row_is_written_once(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    rows = [{"id": f"row-{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(40))]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    args = [*engine_args(tiny_llama_dir), "--max-tokens", "48", "--ignore-eos"]
    local, sharded = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    assert run_cli("run", source, local, *args).exit_code == 0
    known = set(shard_worker_actors())
    outcome: dict = {}
    job = threading.Thread(
        target=lambda: outcome.update(result=run_cli("run", source, sharded, *args, *ray_args()))
    )
    job.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and job.is_alive() and time.monotonic() < deadline:
        for actor_id, info in shard_worker_actors().items():
            if actor_id not in known and info["State"] == "ALIVE" and info["Pid"]:
                os.kill(info["Pid"], signal.SIGKILL)
                killed = actor_id
                break
        time.sleep(0.05)
    job.join(timeout=240)

    assert killed is not None, "no engine worker was seen alive"
    assert shard_worker_actors()[killed]["NumRestarts"] >= 1
    result = outcome["result"]
    assert result.exit_code == 0, result.stderr
    got = pq.read_table(sharded)
    assert got.column("id").to_pylist() == [f"row-{i}" for i in range(40)]
    expected = pq.read_table(local)
    assert got.select(RESULT_COLUMNS).to_pylist() == expected.select(RESULT_COLUMNS).to_pylist()


def test_a_killed_driver_resumes_without_recomputing_finished_shards(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    # One short group (4 distinct questions) and one long, unsplittable group (6 identical
    # prompts of 400 tokens each): the short shard is usually done long before the long one.
    short = [
        {"id": f"s{i}", "prompt": f"{SYSTEM_PROMPTS[0]} {question(i)}", "max_tokens": 2}
        for i in range(4)
    ]
    long = [{"id": f"l{i}", "prompt": SYSTEM_PROMPTS[1], "max_tokens": 400} for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", [*long[:3], *short, *long[3:]])
    args = [*engine_args(tiny_llama_dir), "--ignore-eos", "--kv-cache-memory", "16MiB"]
    output = tmp_path / "ray.parquet"
    command = ["run", source, output, *args, *ray_args("--ray-address", ray_address)]
    checkpoint = tmp_path / ".ray.parquet.ckpt"

    driver = start_process(*command)
    # A wait, not a timing: on a shared 2-core machine the first shard can take minutes.
    deadline = time.monotonic() + 600
    while not list(checkpoint.glob("shard-*.parquet")) and time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()[1]
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.communicate()
    time.sleep(3)  # Ray ends the dead driver's actors; a part is committed whole or not at all
    finished = {p: p.stat().st_mtime_ns for p in checkpoint.glob("shard-*.parquet")}
    finished_rows = sum(pq.read_metadata(p).num_rows for p in finished)
    # Whole shards only: the short one, the long one (when one actor started late and took
    # the long shard first, as under load), or both.
    assert finished_rows in (4, 6, 10), finished
    assert not output.exists()
    watch = threading.Event()
    rewritten: list[str] = []

    def watch_parts() -> None:  # a finished part must never be written again
        while not watch.is_set():
            rewritten.extend(
                p.name
                for p, mtime in finished.items()
                if p.exists() and p.stat().st_mtime_ns != mtime
            )
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_parts)
    watcher.start()

    # The output format may change on a resume: the rerun writes a directory of parts.
    rerun = start_process(*command, "--output-format", "parquet-dir")
    stdout, stderr = rerun.communicate(timeout=900)
    watch.set()
    watcher.join()
    assert rerun.returncode == 0, stderr
    assert rewritten == []
    summary = summary_of(stdout)
    assert summary["resumed_rows"] == finished_rows
    assert summary["rows"] == 10
    local = tmp_path / "local.parquet"
    assert run_cli("run", source, local, *args).exit_code == 0
    expected, got = pq.read_table(local), pq.read_table(output)
    assert got.select(RESULT_COLUMNS).to_pylist() == expected.select(RESULT_COLUMNS).to_pylist()
    assert not checkpoint.exists()
    assert json.loads((output / "_index.json").read_text())["rows"] == 10


def test_without_ray_the_error_names_the_extra(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])

    result = run_cli(
        "run", source, tmp_path / "out.parquet", *engine_args(tiny_llama_dir), *ray_args()
    )

    assert result.exit_code == 1
    assert result.stderr == (
        "Error: --executor ray needs Ray, which is not installed: pip install 'astrai-batch[ray]'\n"
    )


def test_a_second_ray_run_on_a_live_runs_output_exits_1_and_touches_nothing(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    from astrai_batch.jobs.output.run_lock import RunLock

    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(4))]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.parquet"
    checkpoint = tmp_path / ".out.parquet.ckpt"
    command = [
        "run",
        source,
        output,
        *engine_args(tiny_llama_dir),
        *ray_args("--ray-address", ray_address),
    ]

    def snapshot() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in sorted(tmp_path.rglob("*"))}

    first = start_process(*command)
    try:
        deadline = time.monotonic() + 120
        lock_file = checkpoint / ".lock"
        while not (lock_file.exists() and lock_file.read_text() == f"{first.pid}\n"):
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first run took no lock"
            time.sleep(0.01)
        # Paused right after taking its lock (before it reads the input), the first run
        # is alive and holds the lock while the second tries.
        first.send_signal(signal.SIGSTOP)
        before = snapshot()
        second = start_process(*command, "--restart")
        stdout, stderr = second.communicate(timeout=120)
        assert second.returncode == 1
        assert stdout == ""
        assert stderr == f"Error: another astrai-batch run (pid {first.pid}) is writing {output}\n"
        assert snapshot() == before
    finally:
        # The first run's own completion is what the local lock tests check; here it ends.
        first.kill()
        first.communicate()
    lock = RunLock(checkpoint, str(output))
    lock.acquire()  # the kernel dropped the dead holder's lock
    lock.release()


def test_openai_lines_on_ray_warn_once_per_ignored_field_and_answer_every_prompt(
    tiny_llama_dir: Path, tmp_path: Path, ray_address: str
) -> None:
    """Ignored body fields warn once per name (as a local run does), and a completions line
    of several prompts is written as the local run writes it."""

    def line(custom_id: str, **body) -> dict:
        return {"custom_id": custom_id, "url": "/v1/completions", "body": body}

    lines = [
        line("a", prompt=question(1), stream_options={"include_usage": True}, user="u1"),
        line("b", prompt=[question(2), question(3), question(4)], n=2, user="u2"),
        line("c", prompt=[[1, 45, 46], [1, 47]], stream_options={}),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    args = [a for a in engine_args(tiny_llama_dir) if a != "--quiet"]
    runs = {}
    for name, extra in (("local", []), ("ray", ray_args("--ray-address", ray_address))):
        output = tmp_path / f"{name}.jsonl"
        result = run_cli("run", source, output, *args, *extra)
        assert result.exit_code == 0, result.stderr
        warnings = [text for text in result.stderr.splitlines() if "warning: body field" in text]
        assert [text.split("'")[1] for text in warnings] == ["stream_options", "user"], name
        runs[name] = [json.loads(text) for text in output.read_text().splitlines()]
    for got, expected in zip(runs["ray"], runs["local"], strict=True):
        assert got["error"] is None
        for body in (got["response"]["body"], expected["response"]["body"]):
            del body["id"], body["created"], body["usage"]["prompt_tokens_details"]
        assert got == expected
    assert [c["index"] for c in runs["ray"][1]["response"]["body"]["choices"]] == list(range(6))
