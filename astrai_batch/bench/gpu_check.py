"""The device check: exactness, the shared-prefix bench, CUDA graphs on and off, host time and
memory, as JSON files.

Built for a GPU machine that receives only our source tree: models are built from configs
with random weights on the device (`random_models`), prompts are token ids, the tokenizer is
trained in code. With `device="cpu"` the same steps run on the tiny model in seconds, so the
check itself is tested. Each step writes one JSON file under the output directory as soon as
it is done (a check cut short by a time limit keeps what it finished), then `summary.json`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from astrai_batch.bench.gpu_kernels import check_kernel_backends
from astrai_batch.bench.graph_check import graphs_on_off
from astrai_batch.bench.greedy_agreement import agreement, engine_greedy, hf_greedy
from astrai_batch.bench.host_overhead import measure_host_overhead
from astrai_batch.bench.machine import machine_info
from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.peers import BatchSizeChoice, run_hf_generate, run_hf_generate_batch
from astrai_batch.bench.prompts import BenchPrompts, random_shared_prefix_ids
from astrai_batch.bench.random_models import LLAMA_1B, SMOLLM2_135M, TINY, ModelShape, build_model
from astrai_batch.bench.tp_check import tensor_parallel_check
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats


@dataclass(frozen=True)
class CheckPlan:
    """Sizes of every step; one plan per kind of device."""

    exact_shapes: tuple[ModelShape, ...]
    exact_prompts: int
    exact_tokens: int
    bench_shape: ModelShape
    bench_dtype: torch.dtype
    system_prompts: int
    questions_per_prompt: int
    system_tokens: int
    question_tokens: int
    bench_tokens: int
    host_seqs: int
    host_context: int
    host_steps: int


GPU_PLAN = CheckPlan(
    exact_shapes=(SMOLLM2_135M, LLAMA_1B),
    exact_prompts=8,
    exact_tokens=32,
    bench_shape=LLAMA_1B,
    bench_dtype=torch.bfloat16,
    system_prompts=8,
    questions_per_prompt=32,
    system_tokens=256,
    question_tokens=24,
    bench_tokens=64,
    host_seqs=256,
    host_context=512,
    host_steps=32,
)
CPU_PLAN = CheckPlan(
    exact_shapes=(TINY,),
    exact_prompts=4,
    exact_tokens=8,
    bench_shape=TINY,
    bench_dtype=torch.float32,
    system_prompts=2,
    questions_per_prompt=2,
    system_tokens=24,
    question_tokens=6,
    bench_tokens=4,
    host_seqs=16,
    host_context=64,
    host_steps=4,
)


def run_gpu_check(out_dir: Path, device: str, log: Callable[[str], None] = print) -> dict:
    """Runs every step on `device` ("cuda" or "cpu"), writing JSON files; returns the summary."""
    target = torch.device(device)
    plan = GPU_PLAN if target.type == "cuda" else CPU_PLAN
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    files: dict[str, Any] = {}

    def step(name: str, body: Callable[[], dict]) -> None:
        log(f"gpu_check: {name} ...")
        began = time.perf_counter()
        _reset_peak(target)
        result = body()
        result["seconds"] = round(time.perf_counter() - began, 3)
        result["peak_device_memory_bytes"] = _peak(target)
        _write(out_dir / f"{name}.json", result)
        files[name] = result.get("passed")
        log(f"gpu_check: {name} done in {result['seconds']} s")

    step("machine", lambda: {"machine": machine_info(target).to_dict()})
    for shape in plan.exact_shapes:
        for dtype in (torch.float32, torch.bfloat16):
            name = f"exactness_{shape.name}_{str(dtype).removeprefix('torch.')}"
            step(name, lambda s=shape, d=dtype: _exactness(s, d, target, plan))
    step("bench_shared_prefix", lambda: _bench(plan, target))
    step(
        "cuda_graphs",
        lambda: graphs_on_off(
            plan.bench_shape,
            plan.bench_dtype,
            _shared_prefix_prompts(plan),
            plan.bench_tokens,
            _bench_engine(target),
            target,
        ),
    )
    step("host_overhead", lambda: _host(plan, target))
    step("attention_backends", lambda: _kernels(plan, target))
    step("tensor_parallel", lambda: tensor_parallel_check(target))
    summary = {
        "device": str(target),
        "files": files,
        "passed": all(value is not False for value in files.values()),
        "seconds": round(time.perf_counter() - started, 3),
    }
    _write(out_dir / "summary.json", summary)
    return summary


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
        "kv_pool_pages": pages,
        "ratio_vs_generate": ours.generated_tokens_per_second
        / generate.generated_tokens_per_second,
        "ratio_vs_generate_batch": ours.generated_tokens_per_second
        / batch.generated_tokens_per_second,
    }
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
    _release(loaded, device)
    return result


def _release(loaded: LoadedModel, device: torch.device) -> None:
    del loaded
    _empty_cache(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def _write(path: Path, value: dict) -> None:
    temp = path.with_suffix(".json.tmp")
    temp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(path)
