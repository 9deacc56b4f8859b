"""Bytes and time to read every Ray chunk of one input: the old way (each chunk reopens the
input and skips to its start) against ranged reads (`iter_rows(start, stop)` on the
driver's opened source). Reads go through the logging wrapper of `tests/wrapped_fs.py`.

    PYTHONPATH=$PWD python scripts/bench_chunk_reads.py [--rows 200000] [--chunks 8]

Prints, per input kind, the bytes read by all chunks together (as a multiple of the file
size) and the median of three timings of reading every chunk.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from wrapped_fs import ReadLog, counted

from astrai_batch.io import open_input
from astrai_batch.io.filesystems import resolve


def write_inputs(folder: Path, rows: int) -> dict[str, Path]:
    lines = [
        json.dumps({"id": f"r{i}", "prompt": f"Question {i}: " + "x" * 80}) for i in range(rows)
    ]
    text = ("\n".join(lines) + "\n").encode()
    paths = {"jsonl": folder / "in.jsonl", "jsonl.gz": folder / "in.jsonl.gz"}
    paths["jsonl"].write_bytes(text)
    paths["jsonl.gz"].write_bytes(gzip.compress(text))
    paths["parquet"] = folder / "in.parquet"
    table = pa.table(
        {"id": [f"r{i}" for i in range(rows)], "prompt": [json.loads(x)["prompt"] for x in lines]}
    )
    pq.write_table(table, paths["parquet"], row_group_size=max(1, rows // 16))
    return paths


def old_way(path: Path, log: ReadLog, chunk: int, chunks: int) -> None:
    for number in range(chunks):  # each chunk reopens the input (scan, ids, fingerprint-free)
        source = open_input(counted(resolve(path), log))
        list(itertools.islice(source.iter_rows(number * chunk), chunk))


def ranged(source, chunk: int, chunks: int) -> None:
    for number in range(chunks):
        list(source.iter_rows(number * chunk, (number + 1) * chunk))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()
    chunk = -(-args.rows // args.chunks)
    chunk = -(-chunk // 256) * 256
    with tempfile.TemporaryDirectory() as folder:
        for kind, path in write_inputs(Path(folder), args.rows).items():
            size = path.stat().st_size
            results = {}
            for name in ("old", "ranged"):
                times, read = [], 0
                for _ in range(3):
                    log = ReadLog()
                    source = open_input(counted(resolve(path), log)) if name == "ranged" else None
                    log.clear()
                    began = time.perf_counter()
                    if name == "old":
                        old_way(path, log, chunk, args.chunks)
                    else:
                        ranged(source, chunk, args.chunks)
                    times.append(time.perf_counter() - began)
                    read = sum(size for _, _, size in log.reads)
                results[name] = (read / size, statistics.median(times))
            (old_x, old_s), (new_x, new_s) = results["old"], results["ranged"]
            print(
                f"{kind:9s} {size / 1e6:7.1f} MB  old: {old_x:5.2f}x file, {old_s:6.2f} s   "
                f"ranged: {new_x:5.2f}x file, {new_s:6.2f} s   speedup {old_s / new_s:4.1f}x"
            )


if __name__ == "__main__":
    main()
