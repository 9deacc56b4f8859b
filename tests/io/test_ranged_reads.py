"""A range of rows reads only its own bytes: every read goes through a filesystem wrapper
that logs its offset and size (`wrapped_fs`), and a range may read nothing that lies wholly
before its first row (JSONL: that row's byte offset; Parquet: the column chunks of the row
groups before it), and a Parquet range reads no row group after it either."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wrapped_fs import ReadLog, counted

from astrai_batch.io import open_input
from astrai_batch.io.filesystems import resolve
from astrai_batch.io.jsonl_input import OFFSET_STRIDE

ROWS = 4 * OFFSET_STRIDE + 37


def jsonl_lines() -> list[bytes]:
    lines = []
    for i in range(ROWS):
        lines.append((json.dumps({"id": f"r{i}", "prompt": "x" * (i % 50)}) + "\n").encode())
        if i % 7 == 0:
            lines.append(b"\n")  # blank lines are not rows but take bytes
    return lines


def row_offsets(lines: list[bytes]) -> list[int]:
    """The byte offset of each row, counted from the file's own bytes."""
    offsets, position = [], 0
    for line in lines:
        if line.strip():
            offsets.append(position)
        position += len(line)
    return offsets


@pytest.mark.parametrize("start", [0, OFFSET_STRIDE, 3 * OFFSET_STRIDE, 2 * OFFSET_STRIDE + 5])
def test_a_jsonl_range_reads_from_its_first_row_not_the_file_start(tmp_path: Path, start) -> None:
    lines = jsonl_lines()
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    log = ReadLog()
    location = counted(resolve(path), log)
    source = open_input(location)
    assert log.bytes_read(location.path) >= path.stat().st_size  # the open scan reads it all
    log.clear()

    stop = start + OFFSET_STRIDE
    rows = list(source.iter_rows(start, stop))

    assert [row.id for row in rows] == [f"r{i}" for i in range(start, stop)]
    recorded = row_offsets(lines)[start - start % OFFSET_STRIDE]
    assert log.lowest_offset(location.path) == recorded
    if start % OFFSET_STRIDE == 0:  # a chunk boundary: not one byte before its first row
        assert recorded == row_offsets(lines)[start]


def test_a_gzip_range_decompresses_from_the_start_and_parses_only_its_rows(tmp_path: Path):
    """The documented cost: a gzip stream cannot be entered in the middle."""
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(jsonl_lines())))
    source = open_input(path)
    rows = list(source.iter_rows(3 * OFFSET_STRIDE, 3 * OFFSET_STRIDE + 3))
    assert [row.id for row in rows] == [f"r{i}" for i in range(768, 771)]


def group_byte_ranges(path: Path) -> list[tuple[int, int]]:
    """[first, end) bytes of each row group's column chunks, from the footer."""
    metadata = pq.ParquetFile(path).metadata
    ranges = []
    for number in range(metadata.num_row_groups):
        group = metadata.row_group(number)
        starts, ends = [], []
        for column in range(group.num_columns):
            chunk = group.column(column)
            first = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                first = min(first, chunk.dictionary_page_offset)
            starts.append(first)
            ends.append(first + chunk.total_compressed_size)
        ranges.append((min(starts), max(ends)))
    return ranges


@pytest.mark.parametrize(("start", "stop"), [(300, 500), (250, 420), (0, 100), (900, 1000)])
def test_a_parquet_range_reads_only_the_row_groups_it_overlaps(tmp_path: Path, start, stop):
    path = tmp_path / "in.parquet"
    noise = random.Random(3)  # incompressible prompts: each row group far above the 64 KiB
    # a reader fetches speculatively from the end of the file for the footer
    prompts = [noise.randbytes(600).hex() for _ in range(1000)]
    table = pa.table({"id": [f"r{i}" for i in range(1000)], "prompt": prompts})
    pq.write_table(table, path, row_group_size=100)
    ranges = group_byte_ranges(path)
    log = ReadLog()
    location = counted(resolve(path), log)
    source = open_input(location)
    log.clear()

    rows = list(source.iter_rows(start, stop))

    assert [row.id for row in rows] == [f"r{i}" for i in range(start, stop)]
    wanted = range(start // 100, (stop - 1) // 100 + 1)
    assert min(end - first for first, end in ranges) > 64 * 1024
    for number, (first, end) in enumerate(ranges[: wanted.stop]):
        touched = any(
            offset < end and offset + size > first for _, offset, size in log.reads if size
        )
        assert touched == (number in wanted), f"row group {number}"
    # Groups after the range: only the footer's speculative read may reach into the last.
    after = ranges[wanted.stop : -1]
    assert not any(
        offset < end and offset + size > first
        for first, end in after
        for _, offset, size in log.reads
        if size
    )


def test_a_jsonl_range_on_s3_reads_from_its_first_row(s3_bucket, tmp_path: Path) -> None:
    lines = jsonl_lines()
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    log = ReadLog()
    location = counted(resolve(s3_bucket.upload(path, "ranges/in.jsonl")), log)
    source = open_input(location)
    log.clear()
    start = 2 * OFFSET_STRIDE
    rows = list(source.iter_rows(start, start + 3))
    assert [row.id for row in rows] == [f"r{i}" for i in range(start, start + 3)]
    assert log.lowest_offset(location.path) == row_offsets(lines)[start]
