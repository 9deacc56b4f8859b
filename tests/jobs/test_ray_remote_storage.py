"""Remote storage: a sharded job writes its checkpoint and output to an S3 server (moto's,
started on 127.0.0.1 for these tests) through pyarrow's own S3 filesystem."""

from __future__ import annotations

import socket

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, run_cli, shared_prefix_prompts, summary_of, write_jsonl

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import AtomicObject, resolve

moto_server = pytest.importorskip("moto.server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """(filesystem, URI prefix) of a fresh bucket on a local S3 server."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(
            access_key="test",
            secret_key="test",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir("bucket")
        query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        yield fs, lambda key: f"s3://test:test@bucket/{key}?{query}"
    finally:
        server.stop()


def names(fs: pafs.FileSystem, directory: str) -> list[str]:
    selector = pafs.FileSelector(directory, allow_not_found=True, recursive=True)
    return sorted(info.path for info in fs.get_file_info(selector))


def test_an_aborted_object_write_leaves_nothing(s3) -> None:
    fs, uri = s3
    target = resolve(uri("atomic/out.parquet"))
    assert target.shown == "s3://bucket/atomic/out.parquet"  # no credentials in messages
    output = AtomicObject(target)
    output.handle.write(b"partial")
    output.abort()
    assert names(fs, "bucket/atomic") == []

    output = AtomicObject(target)
    output.handle.write(b"whole")
    assert names(fs, "bucket/atomic") != ["bucket/atomic/out.parquet"]
    output.commit()
    assert names(fs, "bucket/atomic") == ["bucket/atomic/out.parquet"]
    with pytest.raises(OutputError, match="already exists; pass --overwrite"):
        AtomicObject(target)


def test_a_sharded_job_writes_to_s3_and_a_failed_one_leaves_no_output(
    s3, ray_address, tiny_llama_dir, tmp_path
) -> None:
    fs, uri = s3
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(12))]
    rows[3] = {"id": "r3", "prompt": 17}
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    ray_args = ["--executor", "ray", "--workers", "2", *engine_args(tiny_llama_dir)]
    local = tmp_path / "local.parquet"
    assert run_cli("run", source, local, *engine_args(tiny_llama_dir)).exit_code == 0

    failed = run_cli("run", source, uri("job/out.parquet"), *ray_args, "--max-errors", "0")
    assert failed.exit_code == 1
    assert "no output written" in failed.stderr
    assert "bucket/job/out.parquet" not in names(fs, "bucket/job")
    assert "bucket/job/out.stats.parquet" not in names(fs, "bucket/job")

    done = run_cli("run", source, uri("job/out.parquet"), *ray_args)
    assert done.exit_code == 0, done.stderr
    assert summary_of(done.stdout)["output"] == "s3://bucket/job/out.parquet"
    assert names(fs, "bucket/job") == ["bucket/job/out.parquet", "bucket/job/out.stats.parquet"]
    got = pq.read_table("bucket/job/out.parquet", filesystem=fs)
    expected = pq.read_table(local)
    columns = ["id", "completion", "finish_reason", "error", "prefix_group"]
    assert got.select(columns).to_pylist() == expected.select(columns).to_pylist()
    assert isinstance(got, pa.Table)
