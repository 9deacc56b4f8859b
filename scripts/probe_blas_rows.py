"""The exhaustive sweep behind the engine's start-up probe (`engine/numerics/blas_rows.py`):
for each K x N, every M from 1 to --max-rows, rows at several offsets, against one GEMM of
--max-rows rows. Prints the M whose rows differ somewhere (and the first such row).

Run: .venv/bin/python scripts/probe_blas_rows.py [--max-rows 2048] [--threads 2]
     [--shapes 576x1536,1536x576,576x192,576x576,576x49152,64x128,128x64,64x32]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--shapes", default="576x1536,1536x576,576x192,576x576,576x49152,64x128,128x64,64x32"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    generator = torch.Generator().manual_seed(0)
    total = args.max_rows
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        weight = torch.randn(n, k, generator=generator)
        a = torch.randn(total, k, generator=generator)
        with torch.inference_mode():
            reference = F.linear(a, weight)
            bad = []
            for m in range(1, total):
                for offset in sorted({0, 1, 5, 17, total - m}):
                    if offset + m > total:
                        continue
                    same = (
                        F.linear(a[offset : offset + m], weight) == reference[offset : offset + m]
                    )
                    rows = same.all(dim=1)
                    if not bool(rows.all()):
                        bad.append((m, offset, int((~rows).nonzero()[0])))
        counts = sorted({m for m, _, _ in bad})
        print(
            f"K x N {k} x {n}: M with differing rows {counts}; (M, offset, first row) {bad[:12]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
