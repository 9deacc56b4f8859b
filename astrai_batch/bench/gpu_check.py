"""The device check: every promise judged on the device, each step a JSON file with its
verdict, figures and time, then `summary.json` listing them (`check_steps`).

Steps: float32 greedy token for token with transformers; bfloat16 agreement (judged against a
floor: rounding flips near-ties, a broken path agrees on almost nothing); the bench against
transformers `generate` and `generate_batch`; CUDA graphs on vs the real eager path (same
tokens); batch invariance on the device (the crowd test, logits bitwise); each installed
kernel against sdpa; host ms per step; peak memory against the budget the engine planned;
the whole run within its time limit (8 minutes on one H200).

Built for a GPU machine that receives only our source tree: models are built from configs
with random weights on the device (`random_models`), prompts are token ids, the tokenizer is
trained in code. With `device="cpu"` the same steps run on the tiny model, so the check
itself is tested.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from astrai_batch.bench.check_steps import CheckRun
from astrai_batch.bench.gpu_check_plan import (
    BF16_MIN_AGREEMENT,
    CPU_PLAN,
    GPU_PLAN,
    STEPS,
    CheckPlan,
)
from astrai_batch.bench.gpu_kernels import check_kernel_backends
from astrai_batch.bench.graph_check import graphs_on_off
from astrai_batch.bench.greedy_agreement import agreement, engine_greedy, hf_greedy
from astrai_batch.bench.host_overhead import measure_host_overhead
from astrai_batch.bench.invariance_check import batch_invariance
from astrai_batch.bench.machine import machine_info
from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.peers import BatchSizeChoice, run_hf_generate, run_hf_generate_batch
from astrai_batch.bench.prompts import BenchPrompts, random_shared_prefix_ids
from astrai_batch.bench.random_models import GEMMA2_WINDOWED, TINY, ModelShape, build_model
from astrai_batch.bench.tp_check import tensor_parallel_check
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats


def run_gpu_check(
    out_dir: Path,
    device: str,
    log: Callable[[str], None] = print,
    only: Sequence[str] = STEPS,
    plan: CheckPlan | None = None,
) -> dict:
    """Runs the steps named in `only` on `device` ("cuda" or "cpu"); returns the summary."""
    target = torch.device(device)
    if plan is None:
        plan = GPU_PLAN if target.type == "cuda" else CPU_PLAN
    run = CheckRun(out_dir, target, log, plan.time_limit_seconds)
    if "machine" in only:
        run.step("machine", lambda: {"machine": machine_info(target).to_dict(), "passed": True})
    if "exactness" in only:
        for shape in plan.exact_shapes:
            for dtype in (torch.float32, torch.bfloat16):
                name = f"exactness_{shape.name}_{str(dtype).removeprefix('torch.')}"
                run.step(name, lambda s=shape, d=dtype: _exactness(s, d, target, plan))
    if "bench_shared_prefix" in only:
        run.step("bench_shared_prefix", lambda: _bench(plan, target))
    if "cuda_graphs" in only:
        run.step("cuda_graphs", lambda: _graphs(plan, target, plan.bench_shape))
        # windows and softcapping reach the graphed decode's attention per layer and call
        run.step("cuda_graphs_windowed", lambda: _graphs(plan, target, GEMMA2_WINDOWED))
    if "batch_invariance" in only:
        run.step(
            "batch_invariance",
            lambda: batch_invariance(
                plan.exact_shapes[0],
                plan.bench_dtype,
                target,
                plan.invariance_prompts,
                plan.exact_tokens,
            ),
        )
    if "host_overhead" in only:
        run.step("host_overhead", lambda: _host(plan, target))
    if "attention_backends" in only:
        run.step("attention_backends", lambda: _kernels(plan, target))
    if "memory" in only:
        run.step("memory", lambda: _memory(plan, target))
    if "tensor_parallel" in only:
        run.step("tensor_parallel", lambda: tensor_parallel_check(target))
    return run.summary()


def main(argv: Sequence[str], run: Callable[..., dict] = run_gpu_check) -> int:
    """`scripts/gpu_check OUT_DIR [--device cuda|cpu] [--only STEP ...]`: 0 when every
    step passed, 1 when any failed, 2 when the device is missing."""
    import sys

    parser = argparse.ArgumentParser(description="Check the engine's promises on a device.")
    parser.add_argument("out_dir", type=Path)
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default)
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    args = parser.parse_args(list(argv))
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    summary = run(
        args.out_dir, args.device, log=lambda m: print(m, file=sys.stderr), only=args.only
    )
    if summary["passed"]:
        print(f"gpu_check: passed; results in {args.out_dir}")
        return 0
    print(f"gpu_check: FAILED ({', '.join(summary['failed'])}); results in {args.out_dir}")
    return 1


def _exactness(shape: ModelShape, dtype: torch.dtype, device: torch.device, plan: CheckPlan):
    """Our greedy tokens against transformers `generate`, one prompt at a time, no padding;
    float32 must agree token for token, bfloat16 reports how much agrees."""
    loaded = build_model(shape, device=device, dtype=dtype)
    prompts = _exact_prompts(shape, plan)
    ours = engine_greedy(loaded, prompts, plan.exact_tokens)
    theirs = hf_greedy(loaded, prompts, plan.exact_tokens)
    result = {
        "model": shape.name,
        "dtype": str(dtype).removeprefix("torch."),
        **agreement(prompts, ours, theirs),
    }
    if dtype == torch.float32:
        result["passed"] = result["exact_rows"] == result["rows"]
    else:
        result["min_token_agreement"] = BF16_MIN_AGREEMENT
        result["passed"] = result["token_agreement"] >= BF16_MIN_AGREEMENT
    _release(loaded, device)
    return result


def _bench(plan: CheckPlan, device: torch.device) -> dict:
    """The shared-prefix workload as token ids: ours, `generate`, `generate_batch`, each
    warmed up first, in one process (ours first: it sizes the pool `generate_batch` gets)."""
    loaded = build_model(plan.bench_shape, device=device, dtype=plan.bench_dtype)
    engine = _bench_engine(device)
    bench_prompts = _bench_prompts(plan, engine.page_size)
    prompts = bench_prompts.prompt_token_ids
    warm = bench_prompts.head(8, 4)  # first calls at new shapes allocate and tune kernels
    pages = run_ours(loaded, warm, engine, repeat=None).engine.kv_pool_pages
    choice = BatchSizeChoice(32)  # left-padded batches of 32, as the CPU bench's default was
    run_hf_generate(loaded, warm, choice, repeat=None)
    run_hf_generate_batch(loaded, warm, engine, pages, repeat=None)
    _empty_cache(device)
    ours = run_ours(loaded, bench_prompts, engine, repeat=0)
    _empty_cache(device)
    # invariant numerics' cost: the same run under --fast-numerics (its kernels warmed first)
    fast_engine = dataclasses.replace(engine, numerics="fast")
    run_ours(loaded, warm, fast_engine, repeat=None)
    fast = run_ours(loaded, bench_prompts, fast_engine, repeat=0)
    _empty_cache(device)
    generate = run_hf_generate(loaded, bench_prompts, choice, repeat=0)
    _empty_cache(device)
    pages = ours.engine.kv_pool_pages
    batch = run_hf_generate_batch(loaded, bench_prompts, engine, pages, repeat=0)
    runs = {run.system: run for run in (ours, generate, batch)}
    result = {
        "model": plan.bench_shape.name,
        "dtype": str(plan.bench_dtype).removeprefix("torch."),
        "prompts": len(prompts),
        "max_tokens": plan.bench_tokens,
        "systems": {
            name: {
                "wall_seconds": run.wall_seconds,
                "generated_tokens_per_second": run.generated_tokens_per_second,
                "engine_overhead": run.engine_overhead,
            }
            for name, run in runs.items()
        },
        "fast_numerics": {
            "wall_seconds": fast.wall_seconds,
            "generated_tokens_per_second": fast.generated_tokens_per_second,
            "attention_backend": fast.engine.attention_backend,
        },
        "invariant_over_fast_wall": ours.wall_seconds / fast.wall_seconds,
        "kv_pool_pages": pages,
        "ratio_vs_generate": ours.generated_tokens_per_second
        / generate.generated_tokens_per_second,
        "ratio_vs_generate_batch": ours.generated_tokens_per_second
        / batch.generated_tokens_per_second,
        "min_ratio_vs_generate": plan.min_ratio_vs_generate,
        "min_ratio_vs_generate_batch": plan.min_ratio_vs_generate_batch,
    }
    result["passed"] = (
        all(run.generated_tokens_per_second > 0 for run in runs.values())
        and result["ratio_vs_generate"] >= plan.min_ratio_vs_generate
        and result["ratio_vs_generate_batch"] >= plan.min_ratio_vs_generate_batch
    )
    _release(loaded, device)
    return result


def _shared_prefix_prompts(plan: CheckPlan) -> list[tuple[int, ...]]:
    return random_shared_prefix_ids(
        plan.system_prompts,
        plan.questions_per_prompt,
        plan.system_tokens,
        plan.question_tokens,
        plan.bench_shape.vocab_size,
    )


def _bench_engine(device: torch.device) -> EngineConfig:
    return EngineConfig(
        gpu_memory_utilization=0.5 if device.type == "cuda" else 0.9,
        kv_cache_memory=None if device.type == "cuda" else 64 * 1024**2,
    )


def _bench_prompts(plan: CheckPlan, page_size: int) -> BenchPrompts:
    """The shared-prefix workload as token ids: system prompts, each with its questions."""
    prompts = _shared_prefix_prompts(plan)
    return BenchPrompts(
        workload="shared-prefix (token ids)",
        prompt_token_ids=tuple(prompts),
        max_tokens=plan.bench_tokens,
        ideal=ideal_prefix_stats(prompts, page_size=page_size),
    )


def _exact_prompts(shape: ModelShape, plan: CheckPlan) -> list[list[int]]:
    rng = random.Random(7)
    return [
        [rng.randrange(3, shape.vocab_size) for _ in range(rng.choice([5, 17, 33, 64, 90, 150]))]
        for _ in range(plan.exact_prompts)
    ]


def _kernels(plan: CheckPlan, device: torch.device) -> dict:
    shape = plan.exact_shapes[0]
    return check_kernel_backends(
        device,
        exact_shape=shape,
        exact_prompts=_exact_prompts(shape, plan),
        exact_tokens=plan.exact_tokens,
        greedy=engine_greedy,
        bench_shape=plan.bench_shape,
        bench_prompts=_bench_prompts(plan, _bench_engine(device).page_size),
        bench_engine=_bench_engine(device),
        release=lambda loaded: _release(loaded, device),
    )


def _host(plan: CheckPlan, device: torch.device) -> dict:
    loaded = build_model(TINY, device=device)
    result = measure_host_overhead(
        loaded, num_seqs=plan.host_seqs, context=plan.host_context, steps=plan.host_steps
    ).to_dict()
    result["model"] = TINY.name
    result["host_ms_budget"] = plan.host_ms_budget
    result["passed"] = result["host_ms_per_step"] <= plan.host_ms_budget
    _release(loaded, device)
    return result


def _graphs(plan: CheckPlan, device: torch.device, shape: ModelShape) -> dict:
    return graphs_on_off(
        shape,
        plan.bench_dtype,
        _shared_prefix_prompts(plan),
        plan.bench_tokens,
        _bench_engine(device),
        device,
    )


def _memory(plan: CheckPlan, device: torch.device) -> dict:
    """CUDA: the bench workload on an engine sized by `--gpu-memory-utilization` (weights, a
    profiled step, the KV pool, the graph pool); the allocator's peak over the run must stay
    within utilization x total. CPU: no device counters, so only the plan is reported."""
    engine = _bench_engine(device)
    if device.type != "cuda":
        return {"measured": None, "why": "no device memory counters on cpu", "passed": True}
    loaded = build_model(plan.bench_shape, device=device, dtype=plan.bench_dtype)
    _, total = torch.cuda.mem_get_info(device)
    allowed = int(total * engine.gpu_memory_utilization)
    torch.cuda.reset_peak_memory_stats(device)
    ours = run_ours(loaded, _bench_prompts(plan, engine.page_size), engine, repeat=None)
    peak = torch.cuda.max_memory_allocated(device)
    _release(loaded, device)
    return {
        "model": plan.bench_shape.name,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "total_bytes": total,
        "allowed_bytes": allowed,
        "kv_pool_pages": ours.engine.kv_pool_pages,
        "peak_allocated_bytes": peak,
        "passed": peak <= allowed,
    }


def _release(loaded: LoadedModel, device: torch.device) -> None:
    del loaded
    _empty_cache(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
