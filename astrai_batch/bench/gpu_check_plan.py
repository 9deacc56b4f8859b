"""The sizes and thresholds of the device check, one plan per kind of device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from astrai_batch.bench.random_models import LLAMA_1B, SMOLLM2_135M, TINY, ModelShape

# bfloat16 greedy tokens agreeing with transformers (float32 weights rounded): a floor, not a
# promise of exactness (see `gpu_check`)
BF16_MIN_AGREEMENT = 0.5


@dataclass(frozen=True)
class CheckPlan:
    """Sizes and thresholds of every step."""

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
    host_ms_budget: float  # host work per step at host_seqs decodes
    invariance_prompts: int
    min_ratio_vs_generate: float  # our generated tokens/s over the peer's, at least
    min_ratio_vs_generate_batch: float
    time_limit_seconds: float


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
    host_ms_budget=2.0,
    invariance_prompts=48,
    min_ratio_vs_generate=1.0,
    min_ratio_vs_generate_batch=1.0,
    time_limit_seconds=480.0,
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
    host_ms_budget=50.0,  # a shared CI core; the figure that matters is the GPU plan's
    invariance_prompts=8,
    min_ratio_vs_generate=0.0,  # 4 tiny prompts time nothing: figures recorded, any ratio
    min_ratio_vs_generate_batch=0.0,
    time_limit_seconds=900.0,
)
STEPS = (
    "machine",
    "exactness",
    "bench_shared_prefix",
    "cuda_graphs",
    "batch_invariance",
    "host_overhead",
    "attention_backends",
    "memory",
    "tensor_parallel",
)
