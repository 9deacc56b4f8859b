"""Ray's first stage reads each chunk's range only (no Ray needed: the stage is a plain
callable). The driver opens the input once; each chunk then reads from its first row on,
through a filesystem wrapper that logs every read (`wrapped_fs`). Before, every chunk
reopened the input: a JSONL was re-read and re-hashed from byte 0, a Parquet input's id
columns were read in full, O(chunks x input)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from wrapped_fs import ReadLog, counted

from astrai_batch.io import open_input
from astrai_batch.io.filesystems import resolve
from astrai_batch.jobs.executors.ray_stages import ChunkReader
from astrai_batch.jobs.options.config import JobConfig

CHUNK = 256
ROWS = 3 * CHUNK + 40


def test_each_jsonl_chunk_reads_from_its_own_first_row(tiny_llama_dir: Path, tmp_path) -> None:
    lines = [
        (json.dumps({"id": f"r{i}", "prompt": f"Question {i}"}) + "\n").encode()
        for i in range(ROWS)
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    offsets = [sum(map(len, lines[:i])) for i in range(ROWS)]
    log = ReadLog()
    location = counted(resolve(path), log)
    config = JobConfig(model=str(tiny_llama_dir))
    source = open_input(location, **config.input_options())
    reader = ChunkReader(source, config, CHUNK, config.model)
    # What a Ray task receives: the driver's source, pickled with its recorded offsets.
    shipped = pickle.loads(pickle.dumps(open_input(path, **config.input_options())))
    assert list(shipped.iter_rows(CHUNK, CHUNK + 2)) == list(source.iter_rows(CHUNK, CHUNK + 2))

    for chunk in range(4):
        log.clear()
        keyed = reader(pa.table({"id": [chunk]}))
        first, end = chunk * CHUNK, min(ROWS, (chunk + 1) * CHUNK)
        assert keyed.column("index").to_pylist() == list(range(first, end))
        assert log.lowest_offset(location.path) == offsets[first], f"chunk {chunk}"


def first_byte(group) -> int:
    """Where a row group's first column chunk begins (a dictionary page comes first)."""
    firsts = []
    for column in map(group.column, range(group.num_columns)):
        first = column.data_page_offset
        if column.has_dictionary_page and column.dictionary_page_offset is not None:
            first = min(first, column.dictionary_page_offset)
        firsts.append(first)
    return min(firsts)


def test_each_parquet_chunk_reads_only_its_row_groups(tiny_llama_dir: Path, tmp_path) -> None:
    path = tmp_path / "in.parquet"
    noise = random.Random(5)  # row groups far above the 64 KiB a reader fetches
    # speculatively from the end of the file for the footer
    prompts = [f"Question {i} {noise.randbytes(160).hex()}" for i in range(4 * CHUNK)]
    table = pa.table({"id": [f"r{i}" for i in range(4 * CHUNK)], "prompt": prompts})
    pq.write_table(table, path, row_group_size=CHUNK)
    log = ReadLog()
    location = counted(resolve(path), log)
    config = JobConfig(model=str(tiny_llama_dir))
    source = open_input(location, **config.input_options())
    reader = ChunkReader(source, config, CHUNK, config.model)
    metadata = pq.ParquetFile(path).metadata
    group_starts = [first_byte(metadata.row_group(g)) for g in range(4)]

    for chunk in range(1, 4):  # the last group, too, is larger than the footer read
        log.clear()
        keyed = reader(pa.table({"id": [chunk]}))
        first = chunk * CHUNK
        assert keyed.column("index").to_pylist()[0] == first
        assert log.lowest_offset(location.path) >= group_starts[chunk], f"chunk {chunk}"
