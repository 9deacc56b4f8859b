"""Host work per engine step, the model forward excluded (issue 14, item 1).

Run: .venv/bin/python scripts/bench_host_overhead.py [--json] [--num-seqs 256] [--context 512]

The tiny test model (random weights, built in code), 256 decoding sequences with 512 tokens
of context each, on the CPU by default. Target: host_ms_per_step at most 2 ms.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from astrai_batch.bench.host_overhead import SAMPLING_MODES, measure_host_overhead
from astrai_batch.bench.random_models import SHAPES, TINY, build_model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--sampling", choices=SAMPLING_MODES, default="greedy")
    parser.add_argument("--prefix-groups", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=TINY.name)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--fast-numerics", action="store_true", help="the step-shaped kernels (not invariant)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = build_model(SHAPES[args.shape], device=args.device)
    result = measure_host_overhead(
        loaded,
        num_seqs=args.num_seqs,
        context=args.context,
        steps=args.steps,
        sampling=args.sampling,
        prefix_groups=args.prefix_groups,
        numerics="fast" if args.fast_numerics else "invariant",
    )
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        for key, value in result.to_dict().items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
