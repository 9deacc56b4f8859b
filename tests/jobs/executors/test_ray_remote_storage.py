"""Remote storage: a sharded job reads its input from and writes its checkpoint and output
to an S3 server (moto's, started on 127.0.0.1 for these tests) through pyarrow's own S3
filesystem."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, run_cli, shared_prefix_prompts, summary_of, write_jsonl

from astrai_batch.errors import InputError, OutputError
from astrai_batch.io.filesystems import AtomicObject, resolve
from astrai_batch.io.fingerprint import file_fingerprint, same_content, sampled_fingerprint


def test_an_aborted_object_write_leaves_nothing(s3_bucket) -> None:
    target = resolve(s3_bucket.uri("atomic/out.parquet"))
    assert target.shown == "s3://bucket/atomic/out.parquet"  # no credentials in messages
    output = AtomicObject(target)
    output.handle.write(b"partial")
    output.abort()
    output.check_invariants()
    assert s3_bucket.names("atomic") == []

    output = AtomicObject(target)
    output.handle.write(b"whole")
    assert s3_bucket.names("atomic") != ["bucket/atomic/out.parquet"]
    output.commit()
    output.check_invariants()
    assert s3_bucket.names("atomic") == ["bucket/atomic/out.parquet"]
    with pytest.raises(OutputError, match="already exists; pass --overwrite"):
        AtomicObject(target)


def test_a_sharded_job_reads_and_writes_s3_and_a_failed_one_leaves_no_output(
    s3_bucket, ray_address, tiny_llama_dir, tmp_path
) -> None:
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(12))]
    rows[3] = {"id": "r3", "prompt": 17}
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    remote_source = s3_bucket.upload(source, "job/in.jsonl")
    ray_args = ["--executor", "ray", "--workers", "2", *engine_args(tiny_llama_dir)]
    local = tmp_path / "local.parquet"
    assert run_cli("run", source, local, *engine_args(tiny_llama_dir)).exit_code == 0
    output = s3_bucket.uri("job/out/out.parquet")

    failed = run_cli("run", remote_source, output, *ray_args, "--max-errors", "0")
    assert failed.exit_code == 1
    assert "no output written" in failed.stderr
    assert "bucket/job/out/out.parquet" not in s3_bucket.names("job/out")
    assert "bucket/job/out/out.stats.parquet" not in s3_bucket.names("job/out")

    # What a driver killed while writing the output leaves: removed by the next run.
    with s3_bucket.fs.open_output_stream("bucket/job/out/.out.parquet.tmp-0123abcd") as torn:
        torn.write(b"PAR1 torn")
    done = run_cli("run", remote_source, output, *ray_args)
    assert done.exit_code == 0, done.stderr
    summary = summary_of(done.stdout)
    assert (summary["input"], summary["output"]) == (
        "s3://bucket/job/in.jsonl",
        "s3://bucket/job/out/out.parquet",
    )
    assert s3_bucket.names("job/out") == [
        "bucket/job/out/out.parquet",
        "bucket/job/out/out.stats.parquet",
    ]
    got = pq.read_table("bucket/job/out/out.parquet", filesystem=s3_bucket.fs)
    expected = pq.read_table(local)
    columns = ["id", "completion", "finish_reason", "error", "prefix_group"]
    assert got.select(columns).to_pylist() == expected.select(columns).to_pylist()
    # The same job identity as a local copy of the input: content, not place.
    stored = got.schema.metadata[b"astrai_batch.input"]
    assert (
        stored.replace(b"s3://bucket/job/in.jsonl", str(source.resolve()).encode())
        == (expected.schema.metadata[b"astrai_batch.input"])
    )


def test_an_input_object_has_the_same_content_identity_as_its_local_copy(
    s3_bucket, tmp_path
) -> None:
    table = pa.table({"prompt": [f"p{i}" for i in range(50)]})
    local = tmp_path / "in.parquet"
    pq.write_table(table, local)
    remote = resolve(s3_bucket.upload(local, "fp/in.parquet"))
    for identify in (file_fingerprint, sampled_fingerprint):
        here, there = identify(local), identify(remote)
        assert there["path"] == "s3://bucket/fp/in.parquet"
        assert same_content(here, there)
    with pytest.raises(InputError, match=r"cannot read s3://bucket/fp/missing\.parquet"):
        file_fingerprint(resolve(s3_bucket.uri("fp/missing.parquet")))
