"""What a window's waiting image rows hold, per row, traced with tracemalloc.

Run: PYTHONPATH=$PWD python scripts/trace_window_memory.py [--rows 2000]

Writes the Parquet input of scripts/bench_image_memory.py (`--rows` rows of PNG cells), builds
the tests' tiny LLaVA, reads and prepares the rows as one window (`prepare_window`, as a job
does) and prints the memory the prepared window holds once the input rows are dropped (the
total per row, then the 20 source lines that allocated most of it: bytes per row, objects),
and the traced peak per row while the rows were read and prepared.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import torch
    from bench_image_memory import build_tiny_llava, write_rows

    from astrai_batch.engine.sampling.params import SamplingParams
    from astrai_batch.engine.vision.loading import load_vision_model
    from astrai_batch.io import open_input
    from astrai_batch.jobs.planning.tokenize import PromptEncoder
    from astrai_batch.jobs.planning.window import prepare_window

    with tempfile.TemporaryDirectory() as scratch:
        model = build_tiny_llava(Path(scratch) / "tiny-llava")
        _, tower = load_vision_model(str(model), {}, {"dtype": torch.float32})
        encoder = PromptEncoder(tower.processor.tokenizer, "tiny", vision=tower)
        source_path = Path(scratch) / "in.parquet"
        write_rows(source_path, args.rows, 50)
        source = open_input(source_path, image_column="img")
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        rows = list(source.iter_rows())
        window = prepare_window(
            0, 0, rows, encoder=encoder, base_params=SamplingParams(max_tokens=1),
            page_size=16, group_offset=0, grouping=True,
        )  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()  # the input rows and the window at once
        del rows
        gc.collect()
        after = tracemalloc.take_snapshot()
        stats = after.compare_to(before, "lineno")
        held = sum(stat.size_diff for stat in stats)
        print(f"{len(window.rows)} rows: {held / args.rows:.0f} bytes a row held by the window")
        print(f"peak while reading and preparing: {peak / args.rows:.0f} bytes a row")
        for stat in stats[:20]:
            print(f"{stat.size_diff / args.rows:8.1f} {stat.count_diff:7d}  {stat.traceback[0]}")


if __name__ == "__main__":
    main()
