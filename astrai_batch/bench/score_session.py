"""`astrai-batch bench --workload scoring`: our scoring requests against hf-score-pairs.

The workload is `score_bench.ScoreWorkload` (synthetic 4-choice questions over a few shared
few-shot contexts, token ids from the seed): S contexts (`--num-system-prompts`, preset 3)
of `--system-prompt-words` tokens (preset 400), U questions each (`--questions-per-prompt`,
preset 16). As for the other workloads, a warm-up runs first, then each repeat runs our engine
(once per KV layout) and then the peer, so ratios are pairwise within a repeat.

Results rows use the common schema: `num_prompts` is the rows, `pairs` the (context,
continuation) pairs, `prompt_tokens` the tokens of every pair's model input
`(context + continuation)[:-1]` (what scoring each pair alone computes, the same work for
every system), `pairs_per_second` the throughput; `ideal_prefill_tokens` is the ideal of
`planning.task_prefill` (each token of every pair's input once), `ideal_cache_hit_rate` the
contexts' page-granular reuse; generation columns are null. There is no floor line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from astrai_batch.bench.config import (
    SCORE_PEER_BATCH_SIZE,
    SCORING,
    BenchConfig,
    ours_system,
)
from astrai_batch.bench.machine import MachineInfo, load_average
from astrai_batch.bench.peers import PEER_ATTENTION
from astrai_batch.bench.rss import PeakRss
from astrai_batch.bench.runs import compact_json
from astrai_batch.bench.score_bench import Row, ScoreWorkload, ideal_tokens, run_ours, run_peer
from astrai_batch.engine import LoadedModel
from astrai_batch.errors import AstraiBatchError
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats

WARMUP_ROWS = 1  # one row runs every path (context, forks, the peer batch)
DIFFERENCE = "max_abs_loglikelihood_difference"  # the peer's against our first layout's


@dataclass(frozen=True)
class ScoringSet:
    """The workload's rows and what every system is measured against."""

    rows: list[Row]
    pairs: int
    pair_tokens: int  # sum over pairs of len(context) + len(continuation) - 1
    ideal_prefill_tokens: int
    ideal_cache_hit_rate: float  # the contexts' page-granular reuse
    fingerprint: str

    @classmethod
    def of(cls, rows: list[Row], page_size: int) -> ScoringSet:
        digest = hashlib.sha256(SCORING.encode())
        for context, continuations in rows:
            digest.update(b"\n" + ",".join(map(str, context)).encode())
            for continuation in continuations:
                digest.update(b";" + ",".join(map(str, continuation)).encode())
        contexts = ideal_prefix_stats([context for context, _ in rows], page_size=page_size)
        return cls(
            rows=rows,
            pairs=sum(len(conts) for _, conts in rows),
            pair_tokens=sum(len(ctx) + len(c) - 1 for ctx, conts in rows for c in conts),
            ideal_prefill_tokens=ideal_tokens(rows),
            ideal_cache_hit_rate=contexts.predicted_prefill_saving,
            fingerprint=digest.hexdigest()[:16],
        )


def scoring_workload(config: BenchConfig) -> ScoreWorkload:
    preset = ScoreWorkload()
    return ScoreWorkload(
        shots=config.num_system_prompts or preset.shots,
        questions=config.questions_per_prompt or preset.questions,
        shot_tokens=config.system_prompt_words or preset.shot_tokens,
        seed=config.seed,
    )


def measure_scoring(
    loaded: LoadedModel,
    config: BenchConfig,
    progress: Callable[[str], None],
    started_at: str,
    machine: MachineInfo,
) -> tuple[dict[str, Any], ...]:
    """Results rows of every measured run, in run order."""
    rows = scoring_workload(config).rows(loaded.model.config.vocab_size)
    work = ScoringSet.of(rows, config.engine.page_size)
    batch = config.hf_generate_batch_size or SCORE_PEER_BATCH_SIZE
    progress(
        f"workload {SCORING}: {len(rows)} rows, {work.pairs} pairs, {work.pair_tokens:,} pair "
        f"tokens (ideal prefill {work.ideal_prefill_tokens:,})"
    )
    if config.warmup:
        progress("warm-up")
        warm = ScoringSet.of(rows[:WARMUP_ROWS], config.engine.page_size)
        list(_one_round(loaded, warm, config, batch, None))
    out = []
    for repeat in range(config.repeat):
        for run in _one_round(loaded, work, config, batch, repeat):
            difference = json.loads(run["system_config"]).get(DIFFERENCE)
            progress(
                f"repeat {repeat + 1}/{config.repeat} {run['system']}: "
                f"{run['wall_seconds']:.1f} s, {run['pairs_per_second']:.1f} pairs/s"
                + (
                    ""
                    if difference is None
                    else f", largest |loglikelihood - ours| {difference:.1e}"
                )
            )
            out.append({**run, **_context(config, work, started_at, machine)})
    return tuple(out)


def _one_round(
    loaded: LoadedModel, work: ScoringSet, config: BenchConfig, batch: int, repeat: int | None
) -> list[dict[str, Any]]:
    runs = []
    ours_values = None
    for layout in config.kv_layouts:
        engine = replace(config.engine, kv_layout=layout)
        load = load_average()
        with PeakRss() as rss:
            values, stats, wall = run_ours(loaded, work.rows, engine)
        ours_values = ours_values or values
        runs.append(
            {
                **_run(ours_system(layout), repeat, wall, work, rss.peak_bytes, load),
                "system_config": compact_json(asdict(engine)),
                "prefill_tokens": stats.prefill_tokens,
                "prefill_ratio": stats.prefill_tokens / work.ideal_prefill_tokens,
                "cache_hit_rate": stats.cache.hit_rate,
                "peak_kv_pages": stats.cache.peak_pages_in_use,
                "kv_layout": layout,
                "forward_seconds": stats.forward_seconds,
                "step_seconds": stats.busy_seconds,
                "engine_overhead": 1.0 - stats.forward_seconds / wall,
                "steps": stats.steps,
                "preemptions": stats.preemptions,
            }
        )
    for peer in config.peers:
        loaded.model.set_attn_implementation(PEER_ATTENTION)
        load = load_average()
        with PeakRss() as rss:
            values, wall = run_peer(loaded.model, work.rows, batch)
        settings: dict[str, Any] = {"batch_size": batch, "order": "by length", "padding": "right"}
        if ours_values is not None:
            settings[DIFFERENCE] = _largest_difference(ours_values, values)
        runs.append(
            {
                **_run(peer, repeat, wall, work, rss.peak_bytes, load),
                "system_config": compact_json(settings),
            }
        )
    return runs


def _run(
    system: str,
    repeat: int | None,
    wall: float,
    work: ScoringSet,
    peak_rss: int | None,
    load: float | None,
) -> dict[str, Any]:
    if not wall > 0:
        raise AstraiBatchError(f"{system}: a run took no measurable time ({wall} s)")
    return {
        "system": system,
        "repeat": repeat,
        "wall_seconds": wall,
        "pairs_per_second": work.pairs / wall,
        "total_tokens_per_second": work.pair_tokens / wall,
        "peak_rss_bytes": peak_rss,
        "load_average_1m": load,
    }


def _context(
    config: BenchConfig, work: ScoringSet, started_at: str, machine: MachineInfo
) -> dict[str, Any]:
    return {
        "started_at": started_at,
        "workload": SCORING,
        "workload_fingerprint": work.fingerprint,
        "model": config.model,
        "dtype": config.dtype,
        "seed": config.seed,
        "num_prompts": len(work.rows),
        "pairs": work.pairs,
        "prompt_tokens": work.pair_tokens,
        "generated_tokens": 0,
        "ideal_prefill_tokens": work.ideal_prefill_tokens,
        "ideal_cache_hit_rate": work.ideal_cache_hit_rate,
        "page_size": config.engine.page_size,
        "max_num_seqs": config.engine.max_num_seqs,
        "max_num_batched_tokens": config.engine.max_num_batched_tokens,
        "max_model_len": config.engine.max_model_len,
        "kv_layouts": ",".join(config.kv_layouts),
        **machine.to_dict(),
    }


def _largest_difference(ours: list[list[float]], theirs: list[list[float]]) -> float:
    return max(
        abs(a - b)
        for mine, peer in zip(ours, theirs, strict=True)
        for a, b in zip(mine, peer, strict=True)
    )
