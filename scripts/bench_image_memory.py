"""Peak memory of `astrai-batch run --image-column` on Parquet image bytes as the rows grow.

Run: PYTHONPATH=$PWD python scripts/bench_image_memory.py [--rows 2000 10000] [--jsonl]
     [-- RUN ARGS]

Writes a Parquet file of `--rows` rows: a prompt column and a binary image column of PNG bytes,
a few distinct 64x64 images and, every `--large-every`-th row, one of two 512x512 ones (random
pixels, so PNG cannot shrink them: about 12 kB and 770 kB stored), so the bytes a window keeps
show in the peak. Builds the test suite's tiny LLaVA (tests/vision_kit.py) into a temp dir,
runs the console command on the file in a child process (`--max-tokens 1`) and prints one JSON
line per size with the child's peak RSS (ru_maxrss from os.wait4: the kernel's high-water mark,
the figure `/usr/bin/time -v` prints as "Maximum resident set size"). Arguments after `--` go to
`astrai-batch run` (e.g. `-- --group-window 1000`). The child runs torch with one thread, as in
scripts/bench_memory.py. `--jsonl` writes the same rows as a plain JSONL file whose image
column holds base64 PNG data URLs (the reader keeps large ones as byte ranges of the file,
`astrai_batch/io/data_url_spans.py`).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SMALL, LARGE = (64, 64), (512, 512)
DISTINCT_SMALL, DISTINCT_LARGE = 4, 2
ROW_GROUP = 1000


def png_bytes(seed: int, size: tuple[int, int]) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def write_rows(path: Path, rows: int, large_every: int) -> int:
    """The Parquet input, written a row group at a time; returns the total stored image bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    small = [png_bytes(seed, SMALL) for seed in range(DISTINCT_SMALL)]
    large = [png_bytes(100 + seed, LARGE) for seed in range(DISTINCT_LARGE)]
    schema = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("img", pa.binary())])
    total = 0
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, ROW_GROUP):
            indices = range(start, min(rows, start + ROW_GROUP))
            images = [
                large[(i // large_every) % DISTINCT_LARGE]
                if large_every and i % large_every == 0
                else small[i % DISTINCT_SMALL]
                for i in indices
            ]
            total += sum(len(image) for image in images)
            columns = {
                "id": [f"r{i}" for i in indices],
                "prompt": [f"Question {i}: what is in the image?" for i in indices],
                "img": images,
            }
            writer.write_table(pa.table(columns, schema=schema))
    return total


def write_jsonl_rows(path: Path, rows: int, large_every: int) -> int:
    """The same rows as `write_rows`, as JSON lines with data URLs; returns the image bytes."""
    urls = {}
    total = 0
    with path.open("w") as out:
        for i in range(rows):
            large = bool(large_every) and i % large_every == 0
            if large:
                key = ("large", (i // large_every) % DISTINCT_LARGE)
            else:
                key = ("small", i % DISTINCT_SMALL)
            if key not in urls:
                seed, size = (100 + key[1], LARGE) if large else (key[1], SMALL)
                data = png_bytes(seed, size)
                urls[key] = (len(data), "data:image/png;base64," + base64.b64encode(data).decode())
            size, url = urls[key]
            total += size
            line = {"id": f"r{i}", "prompt": f"Question {i}: what is in the image?", "img": url}
            out.write(json.dumps(line) + "\n")
    return total


def build_tiny_llava(directory: Path) -> Path:
    # The test suite's builder: a 2-layer CLIP tower (32x32 images) and the tiny Llama decoder.
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from vision_kit import save_tiny_llava

    directory.mkdir(parents=True, exist_ok=True)
    return save_tiny_llava(directory)


def run_once(source: Path, output: Path, model: Path, extra: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in bytes, exit status) of one run in a child process."""
    command = [
        sys.executable, "-m", "astrai_batch.cli", "run", str(source), str(output),
        "--model", str(model), "--image-column", "img", "--max-tokens", "1",
        "--kv-cache-memory", "64MiB", "--quiet", "--overwrite", *extra,
    ]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    # ru_maxrss is in KiB on Linux.
    return time.monotonic() - started, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000])
    parser.add_argument("--large-every", type=int, default=50, help="0: no 512x512 images")
    parser.add_argument("--jsonl", action="store_true", help="data URLs in a JSONL file")
    parser.add_argument("--workdir", type=Path, default=None, help="keep files here")
    parser.add_argument("run_args", nargs="*", help="extra arguments for astrai-batch run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        model = build_tiny_llava(workdir / "tiny-llava")
        for rows in args.rows:
            if args.jsonl:
                source = workdir / f"images-{rows}.jsonl"
                stored = write_jsonl_rows(source, rows, args.large_every)
            else:
                source = workdir / f"images-{rows}.parquet"
                stored = write_rows(source, rows, args.large_every)
            output = workdir / f"out-{rows}.parquet"
            seconds, peak, status = run_once(source, output, model, args.run_args)
            if status != 0:
                raise SystemExit(f"astrai-batch run exited with {status} on {rows} rows")
            result = {
                "rows": rows,
                "run_args": args.run_args,
                "image_bytes_mib": round(stored / 2**20, 1),
                "input": source.suffix[1:],
                "input_file_mib": round(source.stat().st_size / 2**20, 1),
                "seconds": round(seconds, 1),
                "peak_rss_mib": round(peak / 2**20, 1),
                "load_average": [round(load, 2) for load in os.getloadavg()],
            }
            print(json.dumps(result), flush=True)
            source.unlink()


if __name__ == "__main__":
    main()
