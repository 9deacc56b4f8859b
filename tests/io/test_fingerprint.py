"""Content identities: whole-file digests for JSONL, sampled ones (with the footer) for
Parquet and model directories; paths never count."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.io.fingerprint import (
    SAMPLE_BYTES,
    directory_fingerprint,
    file_fingerprint,
    files_fingerprint,
    same_content,
    sampled_fingerprint,
)


def test_a_jsonl_file_is_hashed_whole(tmp_path: Path) -> None:
    data = b'{"prompt": "a"}\n' * (SAMPLE_BYTES // 8)  # 2 MiB: larger than any sample
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    entry = file_fingerprint(path)
    assert entry == {
        "path": str(path.resolve()),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    # One byte changed in the middle is seen.
    middle = len(data) // 2
    path.write_bytes(data[:middle] + b"X" + data[middle + 1 :])
    assert not same_content(entry, file_fingerprint(path))


def test_the_same_bytes_at_a_new_path_are_the_same_content(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n')
    copy = tmp_path / "elsewhere.jsonl"
    shutil.copy(path, copy)
    before, after = files_fingerprint("jsonl", [path]), files_fingerprint("jsonl", [copy])
    assert before["files"][0]["path"] != after["files"][0]["path"]
    assert same_content(before["files"][0], after["files"][0])


def test_a_large_file_sample_is_its_head_and_tail(tmp_path: Path) -> None:
    head, middle, tail = b"h" * SAMPLE_BYTES, b"m" * 100, b"t" * SAMPLE_BYTES
    path = tmp_path / "big.bin"
    path.write_bytes(head + middle + tail)
    expected = hashlib.sha256(head + tail).hexdigest()
    assert sampled_fingerprint(path)["sample_sha256"] == expected
    # A change in the middle that keeps the size goes unseen: the documented limit.
    path.write_bytes(head + b"M" * 100 + tail)
    assert sampled_fingerprint(path)["sample_sha256"] == expected
    path.write_bytes(head + middle + tail + b"appended")
    assert sampled_fingerprint(path)["sample_sha256"] != expected


def test_a_parquet_sample_includes_the_whole_footer(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), path)
    data = path.read_bytes()
    footer_length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - footer_length : -8]
    expected = hashlib.sha256(data + b"footer" + footer).hexdigest()  # small: head is all
    assert sampled_fingerprint(path)["sample_sha256"] == expected
    assert files_fingerprint("parquet", [path])["files"][0]["sample_sha256"] == expected


def test_a_file_between_one_and_two_mib_is_sampled_whole(tmp_path: Path) -> None:
    data = bytes(range(256)) * (SAMPLE_BYTES // 256 + 10)
    path = tmp_path / "mid.bin"
    path.write_bytes(data)
    assert sampled_fingerprint(path)["sample_sha256"] == hashlib.sha256(data).hexdigest()


def test_a_model_directory_digest_covers_what_defines_results(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"w" * 100)
    (model / "README.md").write_text("about")
    digest = directory_fingerprint(model)
    moved = tmp_path / "moved"
    shutil.copytree(model, moved)
    (moved / "README.md").write_text("edited docs")
    (moved / ".cache").mkdir()
    (moved / ".cache" / "x").write_text("y")
    assert directory_fingerprint(moved) == digest
    (moved / "model.safetensors").write_bytes(b"v" * 100)
    assert directory_fingerprint(moved) != digest
