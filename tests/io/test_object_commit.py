"""Large outputs on S3 (moto's server): above the single-copy limit (5 GiB on S3, lowered
here to 5 MiB) the commit is a multipart upload of server-side range copies, never one
CopyObject; the target appears whole at completion, and a failed commit leaves the old one."""

from __future__ import annotations

import logging
import random
import re

import pytest

from astrai_batch.io.filesystems import AtomicObject, resolve
from astrai_batch.io.object_commit import MIB, CopyLimits, multipart_copy, s3_client

LOW = CopyLimits(max_copy_bytes=5 * MIB, part_bytes=5 * MIB)


def requests_for(caplog, key: str) -> list[str]:
    """The writing requests moto's server logged for `key` (method and query)."""
    lines = []
    for record in caplog.records:
        found = re.search(
            r'"(\w+) /bucket/' + re.escape(key) + r"(\?\S*)? HTTP", record.getMessage()
        )
        if found and found.group(1) in ("PUT", "POST"):
            lines.append(found.group(1) + (found.group(2) or ""))
    return lines


def commit(target, data: bytes, limits: CopyLimits) -> None:
    output = AtomicObject(target, overwrite=True, limits=limits)
    output.handle.write(data)
    output.commit()
    output.check_invariants()


def test_an_object_over_the_limit_is_committed_by_multipart_copy(s3_bucket, caplog) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    data = random.Random(7).randbytes(12 * MIB + 3)
    target = resolve(s3_bucket.uri("big/out.parquet"))
    commit(target, b"the old output", LOW)
    assert requests_for(caplog, "big/out.parquet") == ["PUT"]  # small: one CopyObject
    caplog.clear()

    commit(target, data, LOW)

    assert target.read_bytes() == data
    assert s3_bucket.names("big") == ["bucket/big/out.parquet"]  # the temporary object is gone
    methods = [
        line.split("?")[0] + ("?" in line) * "?" for line in requests_for(caplog, "big/out.parquet")
    ]
    assert methods == ["POST?", "PUT?", "PUT?", "PUT?", "POST?"]  # create, 3 part copies, complete


def test_at_the_limit_one_copy_still_does(s3_bucket, caplog) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    target = resolve(s3_bucket.uri("edge/out.parquet"))
    commit(target, bytes(5 * MIB), LOW)
    assert requests_for(caplog, "edge/out.parquet") == ["PUT"]
    assert target.read_bytes() == bytes(5 * MIB)


def test_a_failed_multipart_commit_is_aborted_and_the_old_object_stays(s3_bucket) -> None:
    target = resolve(s3_bucket.uri("fail/out.parquet"))
    commit(target, b"the old output", LOW)
    client = s3_client(target.fs)
    with pytest.raises(Exception, match="UploadPartCopy operation: Not Found"):
        multipart_copy(
            client, "bucket/fail/missing", target.path, [(0, 5 * MIB - 1), (5 * MIB, 6 * MIB - 1)]
        )
    assert target.read_bytes() == b"the old output"
    assert client.list_multipart_uploads(Bucket="bucket").get("Uploads", []) == []


def test_copy_limits_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^max_copy_bytes must be > 0 and <= 5368709120, got 0$"):
        CopyLimits(max_copy_bytes=0)
    with pytest.raises(ValueError, match=r"^part_bytes must be between 5242880 and 5368709120"):
        CopyLimits(part_bytes=MIB)
    assert LOW.parts(12 * MIB + 3) == [
        (0, 5 * MIB - 1),
        (5 * MIB, 10 * MIB - 1),
        (10 * MIB, 12 * MIB + 2),
    ]
