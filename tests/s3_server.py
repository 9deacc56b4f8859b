"""moto's S3 server on loopback with one empty bucket, for the tests and the soak."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pyarrow.fs as pafs


@contextlib.contextmanager
def s3_server() -> Iterator[tuple[pafs.FileSystem, str]]:
    """(filesystem, the URI query that reaches it) of a server with the bucket `bucket`."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
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
        yield fs, f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        server.stop()
