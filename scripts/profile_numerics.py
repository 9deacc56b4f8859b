"""Where invariant numerics spend their time: torch's profiler over both modes, per operator.

Run: .venv/bin/python scripts/profile_numerics.py [--workload shared-prefix] [--threads 1]
     [--num-system-prompts 2] [--questions-per-prompt 8] [--max-tokens 16] [--top 14]
     [--dtype float32|bfloat16|auto]

SmolLM2-135M (float32 unless --dtype says otherwise) on the CPU, the bench workload's prompts,
greedy, EOS ignored; the engine core is stepped directly (no job around it). For each mode it
prints the wall time and the operators with the most self CPU time (the aten operators the
model's forward calls).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from torch.profiler import ProfilerActivity, profile

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.prompts import load_prompts
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.threads import set_cpu_threads


def run(loaded, prompts, config: EngineConfig) -> float:
    params = SamplingParams(max_tokens=prompts.max_tokens, temperature=0.0, ignore_eos=True)
    core = EngineCore(loaded, config)
    started = time.perf_counter()
    for i, ids in enumerate(prompts.prompt_token_ids):
        core.add_request(GenerationRequest(i, ids, params))
    while core.num_unfinished:
        core.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="shared-prefix")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--num-system-prompts", type=int, default=2)
    parser.add_argument("--questions-per-prompt", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "auto"))
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    loaded = load_model("smollm2-135m", dtype=args.dtype)
    config = BenchConfig(
        model="smollm2-135m",
        workload=args.workload,
        max_tokens=args.max_tokens,
        num_system_prompts=args.num_system_prompts,
        questions_per_prompt=args.questions_per_prompt,
    )
    prompts = load_prompts(config, loaded.tokenizer, loaded.name)
    print(f"{args.workload}: {prompts.num_prompts} prompts, {prompts.prompt_tokens} prompt tokens")
    for mode in ("invariant", "fast"):
        engine = replace(EngineConfig(), numerics=mode)
        run(loaded, prompts.head(2, 2), engine)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = run(loaded, prompts, engine)
        print(f"\n== {mode}: {wall:.2f} s wall ==", flush=True)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
        print(table, flush=True)


if __name__ == "__main__":
    main()
