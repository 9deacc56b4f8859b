"""A local run on remote storage (moto's S3 server on 127.0.0.1, pyarrow's S3 filesystem):
input and output are URIs, the checkpoint lives beside the output on the object store, a run
killed with kill -9 resumes from it, and a failed run leaves no output object."""

from __future__ import annotations

import json
import signal
import time

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import (
    ROWS,
    comparable,
    engine_args,
    job_args,
    run_cli,
    start_process,
    summary_of,
    write_jsonl,
)

from astrai_batch.jobs.output.run_lock import LOCK_NAME


def remote_manifest(s3_bucket, directory: str) -> dict:
    try:
        with s3_bucket.fs.open_input_stream(f"bucket/{directory}/manifest.json") as stream:
            return json.loads(stream.read())
    except (OSError, ValueError):
        return {"parts": []}  # not written yet


def test_kill_9_then_rerun_against_s3_equals_an_uninterrupted_run(
    s3_bucket, tiny_llama_dir, reference
) -> None:
    source = s3_bucket.upload(reference["source"], "resume/in.jsonl")
    output = s3_bucket.uri("resume/out/out.parquet")
    checkpoint = "resume/out/.out.parquet.ckpt"
    args = job_args(tiny_llama_dir, source, output)
    process = start_process(*args)
    deadline = time.monotonic() + 180
    while len(remote_manifest(s3_bucket, checkpoint)["parts"]) < 3:
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no 3 checkpoint parts on S3 in time"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    manifest = remote_manifest(s3_bucket, checkpoint)
    saved = sum(part["stats"]["input_rows"] for part in manifest["parts"])
    assert "bucket/resume/out/out.parquet" not in s3_bucket.names("resume/out")
    # The dead run's lease is still there; it names a process of this host that is gone.
    assert f"bucket/{checkpoint}/{LOCK_NAME}" in s3_bucket.names("resume/out")

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert summary["resumed_rows"] == saved > 0
    assert summary["rows"] == ROWS
    assert summary["output"] == "s3://bucket/resume/out/out.parquet"
    got = comparable("bucket/resume/out/out.parquet", s3_bucket.fs)
    assert got == comparable(reference["reference"])
    assert s3_bucket.names("resume/out") == [
        "bucket/resume/out/out.parquet",
        "bucket/resume/out/out.stats.parquet",
    ]


def test_a_failed_run_on_s3_leaves_no_output_object(s3_bucket, tiny_llama_dir, tmp_path) -> None:
    rows = [{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": 17}]
    source = s3_bucket.upload(write_jsonl(tmp_path / "in.jsonl", rows), "failed/in.jsonl")
    output = s3_bucket.uri("failed/out/out.parquet")

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir), "--max-errors", "0")

    assert result.exit_code == 1
    names = s3_bucket.names("failed/out")
    assert "bucket/failed/out/out.parquet" not in names
    assert "bucket/failed/out/out.stats.parquet" not in names
    assert not [name for name in names if ".tmp-" in name]
    # Not even the lease: the run released it.
    assert f"bucket/failed/out/.out.parquet.ckpt/{LOCK_NAME}" not in names


def stable(line: str) -> dict:
    """An OpenAI output line without what depends on when the job ran (the response's
    creation time, and its id, a hash that includes it)."""
    value = json.loads(line)
    body = value["response"]["body"]
    value["response"]["body"] = {k: v for k, v in body.items() if k not in ("id", "created")}
    return value


@pytest.mark.parametrize("output_format", ["openai-jsonl", "parquet-dir"])
def test_every_output_format_can_be_written_to_s3(
    s3_bucket, tiny_llama_dir, tmp_path, output_format
) -> None:
    rows = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": f"Question {i}"},
        }
        for i in range(3)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    name = "out.jsonl" if output_format == "openai-jsonl" else "out"
    local = tmp_path / name
    remote = s3_bucket.uri(f"formats/{output_format}/{name}")
    args = [*engine_args(tiny_llama_dir), "--output-format", output_format]
    args += ["--served-model-name", "tiny"]

    assert run_cli("run", source, local, *args).exit_code == 0
    result = run_cli("run", source, remote, *args)

    assert result.exit_code == 0, result.stderr
    prefix = f"bucket/formats/{output_format}"
    if output_format == "openai-jsonl":
        with s3_bucket.fs.open_input_stream(f"{prefix}/{name}") as stream:
            got = stream.read().decode().splitlines()
        assert list(map(stable, got)) == list(map(stable, local.read_text().splitlines()))
    else:
        index = json.loads(s3_bucket.fs.open_input_stream(f"{prefix}/{name}/_index.json").read())
        assert index["rows"] == 3
        # On S3 the parts carry the run id (the index, replaced in one request, is the commit).
        part = index["parts"][0]["file"]
        assert part == f"part-{index['metadata']['astrai_batch.run_id']}-00000.parquet"
        got = pq.read_table(f"{prefix}/{name}/{part}", filesystem=s3_bucket.fs)
        assert got.column("completion").to_pylist() == (
            pq.read_table(local / "part-00000.parquet").column("completion").to_pylist()
        )


def test_plan_reads_a_uri_as_it_reads_a_local_file(s3_bucket, tiny_llama_dir, tmp_path) -> None:
    rows = [{"prompt": f"You are a helpful assistant. Question {i}"} for i in range(20)]
    local = write_jsonl(tmp_path / "in.jsonl", rows)
    remote = s3_bucket.upload(local, "plan/in.jsonl")
    args = ["--model", tiny_llama_dir, "--json", "--workers", "2"]

    here, there = run_cli("plan", local, *args), run_cli("plan", remote, *args)

    assert here.exit_code == there.exit_code == 0, there.stderr
    mine, theirs = json.loads(here.stdout), json.loads(there.stdout)
    assert theirs.pop("input") == "s3://bucket/plan/in.jsonl"
    mine.pop("input")
    assert theirs == mine
