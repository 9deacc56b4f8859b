"""The cost of batch-invariant numerics: our engine with invariant and fast numerics, alternated.

Run: .venv/bin/python scripts/bench_numerics.py [--repeat 3] [--num-system-prompts 4]
     [--questions-per-prompt 16] [--max-tokens 32] [--system-prompt-words N]
     [--workloads shared-prefix,unique] [--dtype float32|bfloat16]
     [--threads N]

One process, SmolLM2-135M (float32 unless --dtype) on the CPU, the bench workloads' prompts,
greedy with end of sequence ignored (every prompt generates exactly max_tokens). For each
workload the two modes run alternately (invariant, fast, invariant, fast, ...) after one
warm-up each, and the script prints each run's wall time, the median ratio invariant / fast
and each run's
roofline (`bench/roofline`: its weight-GEMM FLOPs against the GEMM peak in the dtype,
measured at the start and after each workload, the highest so far, and the share of wall time
outside the forward).
"""

from __future__ import annotations

import argparse

import torch

from astrai_batch.bench.numerics_pairs import alternate_numerics, print_ratio, workload_config
from astrai_batch.bench.prompts import load_prompts
from astrai_batch.bench.roofline import GemmPeak, roofline
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.threads import set_cpu_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--num-system-prompts", type=int, default=4)
    parser.add_argument("--questions-per-prompt", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--system-prompt-words", type=int, default=None)
    parser.add_argument("--workloads", default="shared-prefix,unique")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    with GemmPeak(loaded.model) as peak:
        peak.measure()
        print(
            f"{args.dtype}, {torch.get_num_threads()} threads: GEMM peak {peak.describe()}",
            flush=True,
        )
        for workload in args.workloads.split(","):
            _workload(args, loaded, workload, peak)
            peak.measure()
            print(f"GEMM peak so far: {peak.describe()}", flush=True)


def _workload(args, loaded, workload: str, peak: GemmPeak) -> None:
    config = workload_config(args.model, workload, args)
    prompts = load_prompts(config, loaded.tokenizer, loaded.name)
    walls = alternate_numerics(
        loaded,
        prompts,
        workload,
        repeat=args.repeat,
        warmup=prompts.head(4, 4),
        note=lambda run: roofline(loaded.model, run, peak.best, prompts.num_prompts).line(),
    )
    print_ratio(workload, prompts, walls)


if __name__ == "__main__":
    main()
