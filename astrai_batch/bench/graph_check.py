"""Decode-only steps as CUDA graphs vs eager, on one workload in one process.

Each mode gets its own engine (graphs are captured when it is built); the workload runs once
to warm up (the capture's cost is reported on its own), then once
timed. Reported per mode: throughput, host milliseconds per step (engine time outside the
forward), the share of steps that ran at a bucket's shape; and whether graphs on produced the
greedy tokens of the real eager path (no static decode: what a job without graphs runs).
On a CPU nothing is captured: "graphs on" is the same static, bucketed forward run eagerly,
which is what the CUDA graphs replay.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from astrai_batch.bench.random_models import ModelShape, build_model
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import GenerationRequest

# Fast numerics: the graphed decode is a masked SDPA over the padded context, eager a packed
# one; their sums differ in order, and a near-tie may flip a row's continuation.
MIN_FAST_SAME_ROWS = 0.9


def graphs_on_off(
    shape: ModelShape,
    dtype: torch.dtype,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    engine: EngineConfig,
    device: torch.device,
) -> dict:
    """`compare_graphs` on a model of `shape` with random weights, judged on every device:
    graphs on must give the real eager path's tokens for every row (invariant numerics: the
    static path gives the eager bits; fast numerics: at least MIN_FAST_SAME_ROWS of them),
    and on CUDA every bucketed step must have been captured without a failure."""
    loaded = build_model(shape, device=device, dtype=dtype)
    result = compare_graphs(loaded, prompts, max_tokens, engine)
    result["model"] = shape.name
    result["dtype"] = str(dtype).removeprefix("torch.")
    share = result["same_tokens_rows"] / result["prompts"]
    same = share == 1.0 if engine.numerics == "invariant" else share >= MIN_FAST_SAME_ROWS
    on = result["graphs_on"]
    captured = device.type != "cuda" or (
        on.get("captured") is True and on.get("captures", 0) > 0 and not on["capture_failure"]
    )
    result["passed"] = same and captured
    del loaded
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return result


def compare_graphs(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    engine: EngineConfig,
) -> dict:
    """{"graphs_off": {...}, "graphs_on": {...}, "same_tokens_rows": n, ...}."""
    device = next(loaded.model.parameters()).device
    results: dict = {}
    tokens: dict[str, list[tuple[int, ...]]] = {}
    for name, on in (("graphs_off", False), ("graphs_on", True)):
        cuda = device.type == "cuda"
        config = dataclasses.replace(engine, cuda_graphs=on and cuda)
        core = EngineCore(loaded, config, static_decode=on)
        try:
            _generate(core, prompts, max_tokens, first_id=0)  # warm-up: captures happen here
            before = core.stats()
            began = time.perf_counter()
            tokens[name] = _generate(core, prompts, max_tokens, first_id=len(prompts))
            wall = time.perf_counter() - began
            delta = core.stats() - before
        finally:
            core.close()
        graphs = core.runner.decode_graphs
        results[name] = {
            "wall_seconds": wall,
            "generated_tokens_per_second": delta.decode_tokens / wall,
            "steps": delta.steps,
            "host_ms_per_step": 1000 * (delta.busy_seconds - delta.forward_seconds) / delta.steps,
            "forward_ms_per_step": 1000 * delta.forward_seconds / delta.steps,
        }
        if graphs is not None:
            results[name].update(
                captured=graphs.spec.capture,
                captures=graphs.stats.captures,
                capture_seconds=graphs.stats.capture_seconds,
                bucketed_steps_all_runs=graphs.stats.graphed_steps,
                capture_failure=graphs.stats.failure,
            )
        del core, graphs
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    same = sum(a == b for a, b in zip(tokens["graphs_off"], tokens["graphs_on"], strict=True))
    off, on = results["graphs_off"], results["graphs_on"]
    results.update(
        prompts=len(prompts),
        max_tokens=max_tokens,
        numerics=engine.numerics,
        same_tokens_rows=same,
        throughput_ratio_on_vs_off=on["generated_tokens_per_second"]
        / off["generated_tokens_per_second"],
    )
    return results


def _generate(core: EngineCore, prompts, max_tokens: int, first_id: int) -> list[tuple[int, ...]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for offset, prompt in enumerate(prompts):
        errors = core.add_request(GenerationRequest(first_id + offset, list(prompt), params))
        if errors:
            raise RuntimeError(errors[0].error)
    outputs: dict[int, tuple[int, ...]] = {}
    while core.num_unfinished:
        for result in core.step():
            outputs[result.request_id] = result.token_ids
    return [outputs[first_id + i] for i in range(len(prompts))]
