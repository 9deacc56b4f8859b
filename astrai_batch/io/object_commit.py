"""Committing a finished temporary object onto its target name on an object store, at any
size.

`AtomicObject` writes beside the target and commits with a move; on S3 a move is one
CopyObject request, which S3 refuses above 5 GiB, so a large output could never be
committed (the job failed after all its generation, and again on every rerun). Above
`CopyLimits.max_copy_bytes` the commit is instead a multipart upload of the target whose
parts are server-side copies of the temporary object's byte ranges (UploadPartCopy): no
byte leaves the store, the target appears whole when the upload completes (the old one stays
readable until then), and a failed commit aborts the upload. pyarrow has no request for
this, so it goes through boto3 (installed with the ``s3`` extra), built from the
filesystem's own options (endpoint, region, keys); without boto3 such a commit fails with a
one-line message and the checkpoint stays, so a rerun after installing it finishes the job.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from astrai_batch.errors import OutputError

GIB = 1 << 30
MIB = 1 << 20
# S3's rules: one CopyObject moves at most 5 GiB; a part is 5 MiB .. 5 GiB (the last may be
# smaller); an upload has at most 10,000 parts.
S3_COPY_LIMIT = 5 * GIB
S3_MIN_PART = 5 * MIB
S3_MAX_PARTS = 10_000


@dataclass(frozen=True)
class CopyLimits:
    """How large an object one server-side copy may move, and the part size of the
    multipart copy used above that. Lowered in tests; never raise it above S3's 5 GiB."""

    max_copy_bytes: int = S3_COPY_LIMIT
    part_bytes: int = GIB

    def __post_init__(self) -> None:
        if not 0 < self.max_copy_bytes <= S3_COPY_LIMIT:
            raise ValueError(
                f"max_copy_bytes must be > 0 and <= {S3_COPY_LIMIT}, got {self.max_copy_bytes}"
            )
        if not S3_MIN_PART <= self.part_bytes <= S3_COPY_LIMIT:
            raise ValueError(
                f"part_bytes must be between {S3_MIN_PART} and {S3_COPY_LIMIT}, "
                f"got {self.part_bytes}"
            )

    def parts(self, size: int) -> list[tuple[int, int]]:
        """Inclusive byte ranges of the parts of a `size`-byte object."""
        ranges = [
            (first, min(size, first + self.part_bytes) - 1)
            for first in range(0, size, self.part_bytes)
        ]
        if len(ranges) > S3_MAX_PARTS:
            raise OutputError(
                f"an object of {size} bytes needs {len(ranges)} parts of {self.part_bytes} "
                f"bytes; S3 allows {S3_MAX_PARTS}"
            )
        return ranges


def commit_object(
    fs: pafs.FileSystem, temp: str, target: str, limits: CopyLimits = CopyLimits()
) -> None:
    """Move the finished object `temp` onto `target` (both paths on `fs`)."""
    size = fs.get_file_info(temp).size
    if not isinstance(fs, pafs.S3FileSystem) or size is None or size <= limits.max_copy_bytes:
        fs.move(temp, target)
        return
    multipart_copy(s3_client(fs), temp, target, limits.parts(size))
    fs.delete_file(temp)


def multipart_copy(client: Any, source: str, target: str, ranges: list[tuple[int, int]]) -> None:
    """`target` := `source`, as one multipart upload of server-side range copies; the
    upload's completion is the commit, and any failure aborts it."""
    source_bucket, source_key = source.split("/", 1)
    bucket, key = target.split("/", 1)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    try:
        parts = []
        for number, (first, last) in enumerate(ranges, start=1):
            copied = client.upload_part_copy(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": source_bucket, "Key": source_key},
                CopySourceRange=f"bytes={first}-{last}",
            )
            parts.append({"ETag": copied["CopyPartResult"]["ETag"], "PartNumber": number})
        client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def s3_client(fs: pafs.S3FileSystem) -> Any:
    """A boto3 S3 client reaching what `fs` reaches (its endpoint, region and keys; the
    default credential chain where `fs` has none of its own)."""
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise OutputError(
            "committing an object over 5 GiB on S3 needs boto3: pip install 'astrai-batch[s3]'"
        ) from None
    options = fs.__reduce__()[1][0]  # the keyword arguments fs was built with
    kwargs: dict[str, Any] = {}
    if options.get("endpoint_override"):
        kwargs["endpoint_url"] = (
            f"{options.get('scheme') or 'https'}://{options['endpoint_override']}"
        )
    if options.get("region"):
        kwargs["region_name"] = options["region"]
    if options.get("access_key"):
        kwargs["aws_access_key_id"] = options["access_key"]
        kwargs["aws_secret_access_key"] = options.get("secret_key")
        kwargs["aws_session_token"] = options.get("session_token") or None
    if options.get("anonymous"):
        kwargs["config"] = Config(signature_version=UNSIGNED)
    return boto3.client("s3", **kwargs)
