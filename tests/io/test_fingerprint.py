from __future__ import annotations

import hashlib
import os
from pathlib import Path

from astrai_batch.io.fingerprint import SAMPLE_BYTES, file_fingerprint


def test_small_file_is_hashed_whole(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n')
    entry = file_fingerprint(path)
    assert entry["sample_sha256"] == hashlib.sha256(b'{"prompt": "a"}\n').hexdigest()
    assert entry["size"] == 16


def test_large_file_hashes_head_and_tail_only(tmp_path: Path) -> None:
    head, middle, tail = b"h" * SAMPLE_BYTES, b"m" * 100, b"t" * SAMPLE_BYTES
    path = tmp_path / "big.jsonl"
    path.write_bytes(head + middle + tail)
    expected = hashlib.sha256(head + tail).hexdigest()
    assert file_fingerprint(path)["sample_sha256"] == expected
    stat = path.stat()
    # A change in the middle keeps size and sample hash; only the mtime tells them apart.
    path.write_bytes(head + b"M" * 100 + tail)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_fingerprint(path)["sample_sha256"] == expected
    path.write_bytes(head + middle + tail + b"appended")
    assert file_fingerprint(path)["sample_sha256"] != expected


def test_a_file_between_one_and_two_mib_is_hashed_whole(tmp_path: Path) -> None:
    data = bytes(range(256)) * (SAMPLE_BYTES // 256 + 10)
    path = tmp_path / "mid.parquet"
    path.write_bytes(data)
    assert file_fingerprint(path)["sample_sha256"] == hashlib.sha256(data).hexdigest()
