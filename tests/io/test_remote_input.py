"""Inputs on an object store (moto's S3 server on 127.0.0.1, through pyarrow's own S3
filesystem) read exactly as their local copies: rows, ids, row errors, repeated ids, counts
from any start, and the content identity."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import InputError
from astrai_batch.io import open_input
from astrai_batch.io.fingerprint import same_content

LINES = [
    {"id": "a", "prompt": "Hello there"},
    "",
    {"id": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
    "{not json",
    {"id": "a", "prompt": "a repeated id"},
    "[1, 2]",
    {"id": "c", "prompt": 17},
    {"id": "d", "prompt": "last"},
]


def same_input(local: Path, remote: str, **options) -> None:
    """Both read identically, from the start and from every later row."""
    here, there = open_input(local, **options), open_input(remote, **options)
    assert there.path.shown.startswith("s3://bucket/")
    assert (there.format, there.shape, there.columns()) == (here.format, here.shape, here.columns())
    assert there.count_rows() == here.count_rows()
    assert there.kept_schema() == here.kept_schema()
    assert len(there.duplicates) == len(here.duplicates)
    for start in range(here.count_rows() + 1):
        assert list(there.iter_rows(start)) == list(here.iter_rows(start))
    mine, theirs = here.fingerprint(), there.fingerprint()
    assert mine["format"] == theirs["format"]
    assert len(mine["files"]) == len(theirs["files"])
    assert all(map(same_content, mine["files"], theirs["files"]))


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "gzipped-but-named.jsonl"])
def test_jsonl_objects_read_as_their_local_copies(s3_bucket, write_jsonl, name) -> None:
    local = write_jsonl(name, LINES, compress=name != "in.jsonl")
    remote = s3_bucket.upload(local, f"input/{name}")
    same_input(local, remote, keep_columns=["max_tokens"])
    rows = list(open_input(remote).iter_rows())
    assert [(row.id, row.error) for row in rows] == [
        ("a", None),
        ("b", None),
        (
            None,
            "line 4: invalid JSON: Expecting property name enclosed in double quotes at column 2",
        ),
        (None, "duplicate id 'a' (first at row 0)"),
        (None, "line 6: expected a JSON object, got list"),
        ("c", "prompt must be a string, got integer"),
        ("d", None),
    ]


def test_a_parquet_directory_on_s3_reads_as_its_local_copy(s3_bucket, tmp_path: Path) -> None:
    local = tmp_path / "parts"
    local.mkdir()
    pq.write_table(
        pa.table({"id": ["x", "y", "z"], "prompt": ["one", "two", None], "tag": [1, 2, 3]}),
        local / "part-0.parquet",
        row_group_size=2,
    )
    pq.write_table(
        pa.table({"id": ["x", "w"], "prompt": ["again", "four"], "tag": [4, 5]}),
        local / "part-1.parquet",
    )
    (local / "_SUCCESS").write_bytes(b"")  # a Spark marker, not data
    for file in sorted(local.iterdir()):
        s3_bucket.upload(file, f"dataset/{file.name}")
    same_input(local, s3_bucket.uri("dataset"), keep_columns=["tag"])
    remote = open_input(s3_bucket.uri("dataset"))
    assert [file.name for file in remote.files] == ["part-0.parquet", "part-1.parquet"]
    single = s3_bucket.uri("dataset/part-1.parquet")
    same_input(local / "part-1.parquet", single)


def test_missing_and_empty_remote_inputs_are_refused_in_the_users_terms(s3_bucket) -> None:
    with pytest.raises(InputError, match=r"^input not found: s3://bucket/nothing/in\.jsonl$"):
        open_input(s3_bucket.uri("nothing/in.jsonl"))
    s3_bucket.fs.create_dir("bucket/empty-dir")
    with s3_bucket.fs.open_output_stream("bucket/empty-dir/readme.txt") as stream:
        stream.write(b"not data")
    with pytest.raises(
        InputError, match=r"^no \.parquet files in directory s3://bucket/empty-dir$"
    ):
        open_input(s3_bucket.uri("empty-dir"))


def test_a_line_longer_than_the_read_buffer_reads_whole(s3_bucket, write_jsonl) -> None:
    long_prompt = "word " * 500_000  # 2.5 MB: more than one buffer of the stream
    local = write_jsonl("long.jsonl", [{"prompt": "a"}, {"prompt": long_prompt}, {"prompt": "b"}])
    remote = s3_bucket.upload(local, "input/long.jsonl")
    same_input(local, remote)
    assert [len(row.prompt) for row in open_input(remote).iter_rows()] == [1, len(long_prompt), 1]
