"""Time to turn one image data URL into RGB pixels: `io.image_sources.load_image` against
transformers' own `image_utils.load_image` (the peer), alternating call by call so the
machine's noise falls on both alike; the pixels are checked equal first.

    PYTHONPATH=$PWD python scripts/bench_image_loading.py [--width 1024] [--height 768] [--runs 40]

Prints each median and their ratio (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import time

import numpy as np
from PIL import Image
from transformers.image_utils import load_image as transformers_load_image

from astrai_batch.io.image_sources import ImageRef, load_image


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    pixels = np.random.default_rng(0).integers(0, 256, (args.height, args.width, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=85)
    url = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    ours_image = np.asarray(load_image(ImageRef(url=url)).image)
    if not np.array_equal(ours_image, np.asarray(transformers_load_image(url))):
        raise SystemExit("the pixels differ from transformers'")
    ours, theirs = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        load_image(ImageRef(url=url))
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        transformers_load_image(url)
        theirs.append(time.perf_counter() - start)
    mine, peer = statistics.median(ours), statistics.median(theirs)
    print(
        f"{args.width}x{args.height} JPEG data URL ({len(buffer.getvalue()):,} bytes), median "
        f"of {args.runs} alternating: load_image {mine * 1e3:.2f} ms, transformers "
        f"{peer * 1e3:.2f} ms, ratio {mine / peer:.3f}"
    )


if __name__ == "__main__":
    main()
