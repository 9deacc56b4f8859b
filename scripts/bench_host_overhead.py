"""Host work per engine step, the model forward excluded (issue 14, item 1).

Run: .venv/bin/python scripts/bench_host_overhead.py [--json] [--num-seqs 256] [--context 512]
     [--tensor-parallel-size 2]  (the model saved to a temporary directory, loaded over N ranks;
     host time then includes the broadcast of each step to the other ranks)

The tiny test model (random weights, built in code), 256 decoding sequences with 512 tokens
of context each, on the CPU by default. Target: host_ms_per_step at most 2 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch

from astrai_batch.bench.host_overhead import SAMPLING_MODES, measure_host_overhead
from astrai_batch.bench.random_models import SHAPES, TINY, build_model
from astrai_batch.engine.model.loader import load_model


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
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = build_model(SHAPES[args.shape], device=args.device)
    with tempfile.TemporaryDirectory() as saved:
        if args.tensor_parallel_size > 1:
            loaded.model.save_pretrained(saved)
            loaded.tokenizer.save_pretrained(saved)
            loaded = load_model(
                saved, device=args.device, tensor_parallel_size=args.tensor_parallel_size
            )
        try:
            return _report(args, loaded)
        finally:
            loaded.close()


def _report(args, loaded) -> int:
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
