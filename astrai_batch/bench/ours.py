"""One timed run of our engine over the prompt set."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import anyio

from astrai_batch.bench.config import ours_system
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.rss import PeakRss
from astrai_batch.bench.runs import EngineFigures, SystemRun, check_generated, percentile
from astrai_batch.cache import SeatTable
from astrai_batch.engine import (
    Engine,
    EngineConfig,
    EngineStats,
    GenerationRequest,
    GenerationResult,
    LoadedModel,
    SamplingParams,
)
from astrai_batch.errors import AstraiBatchError


def run_ours(
    loaded: LoadedModel, prompts: BenchPrompts, config: EngineConfig, repeat: int | None
) -> SystemRun:
    """Greedy, end-of-sequence ignored, so every prompt generates exactly `max_tokens`.

    The run is named after `config.kv_layout` (`astrai`, `astrai-contiguous`).

    Wall time covers engine start (KV pool allocation) to the last result, as the
    transformers peers also allocate their caches inside the timed call.
    """
    params = SamplingParams(max_tokens=prompts.max_tokens, temperature=0.0, ignore_eos=True)
    requests = [
        GenerationRequest(request_id=index, prompt_token_ids=ids, params=params)
        for index, ids in enumerate(prompts.prompt_token_ids)
    ]
    with PeakRss() as rss:
        started = time.perf_counter()
        results, stats, shape = anyio.run(_generate, loaded, requests, config)
        wall = time.perf_counter() - started
    system = ours_system(config.kv_layout)
    failed = [r for r in results if r.finish_reason == "error"]
    if failed:
        raise AstraiBatchError(
            f"{system}: {len(failed)} of {len(results)} prompts failed, first: {failed[0].error}"
        )
    generated = check_generated(system, [r.completion_tokens for r in results], prompts.max_tokens)
    first_tokens = [
        r.timings.first_token_seconds
        for r in results
        if r.timings is not None and r.timings.first_token_seconds is not None
    ]
    if len(first_tokens) != len(results):
        raise AstraiBatchError(f"{system}: some results carry no time to first token")
    return SystemRun(
        system=system,
        repeat=repeat,
        wall_seconds=wall,
        prompt_tokens=prompts.prompt_tokens,
        generated_tokens=generated,
        peak_rss_bytes=rss.peak_bytes,
        system_config=json.dumps(asdict(config), sort_keys=True, separators=(",", ":")),
        engine=EngineFigures(
            prefill_tokens=stats.prefill_tokens,
            cache_hit_rate=stats.cache.hit_rate,
            ttft_p50_seconds=percentile(first_tokens, 0.5),
            ttft_p90_seconds=percentile(first_tokens, 0.9),
            peak_kv_pages=stats.cache.peak_pages_in_use,
            kv_pool_pages=shape.pool_pages,
            kv_layout=config.kv_layout,
            attention_backend=shape.attention_backend,
            kv_seats=shape.seats,
            peak_running_seqs=shape.peak_running,
            forward_seconds=stats.forward_seconds,
            step_seconds=stats.busy_seconds,
            steps=stats.steps,
            preemptions=stats.preemptions,
        ),
        token_ids=tuple(r.token_ids for r in sorted(results, key=lambda r: r.request_id)),
    )


@dataclass(frozen=True)
class _KVShape:
    pool_pages: int
    seats: int | None
    peak_running: int
    attention_backend: str


async def _generate(
    loaded: LoadedModel, requests: Sequence[GenerationRequest], config: EngineConfig
) -> tuple[list[GenerationResult], EngineStats, _KVShape]:
    """Like `generate_sync`, and also says what the engine's KV memory held."""
    async with Engine(loaded, config) as engine:
        results = [result async for result in engine.generate(requests)]
        core = engine.core
        shape = _KVShape(
            pool_pages=core.pool.num_pages,
            seats=core.cache.num_seats if isinstance(core.cache, SeatTable) else None,
            peak_running=core.scheduler.peak_running,
            attention_backend=core.attention_backend,
        )
        return results, engine.stats(), shape
