"""Medians, spreads and pairwise ratios of a results table, current or from a baseline file.

Everything is computed from result rows (dicts with the `RESULTS_SCHEMA` columns), so a
baseline file read back from disk summarizes exactly as the run that wrote it did.

Ratios to a peer are pairwise: in each repeat, our generated tokens/s (pairs/s for the
scoring workload) over the peer's in
the same repeat (the runs alternate, so a machine slowing down mid-benchmark affects both
sides of each pair); the summary is the median of those per-repeat ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.bench.config import FLOOR, OURS
from astrai_batch.errors import InputError

# Per-system figures summarized over repeats; engine-only ones are absent for peers.
FIGURES = (
    "wall_seconds",
    "generated_tokens_per_second",
    "total_tokens_per_second",
    "pairs_per_second",
    "peak_rss_bytes",
    "prefill_tokens",
    "prefill_ratio",
    "cache_hit_rate",
    "ttft_p50_seconds",
    "ttft_p90_seconds",
    "peak_kv_pages",
    "kv_seats",
    "peak_running_seqs",
    "engine_overhead",
    "forward_seconds",
    "step_seconds",
    "preemptions",
    "weight_gemm_flops",
    "gemm_peak_flops_per_second",
    "greedy_agreement",
    "greedy_leading_agreement",
    "load_average_1m",
)
CONTEXT = (
    "workload",
    "workload_fingerprint",
    "kv_layouts",
    "max_model_len",
    "model",
    "dtype",
    "num_prompts",
    "pairs",
    "max_tokens",
    "prompt_tokens",
    "ideal_prefill_tokens",
    "ideal_cache_hit_rate",
    "page_size",
    "cpu_model",
    "cpu_cores",
    "device",
    "torch_version",
    "transformers_version",
    "astrai_batch_version",
    "started_at",
)


@dataclass(frozen=True)
class Spread:
    """Median, smallest and largest of a figure over repeats."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        kept = [float(value) for value in values if value is not None]
        if not kept:
            return None
        return cls(statistics.median(kept), min(kept), max(kept), len(kept))

    def to_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high, "count": self.count}


@dataclass(frozen=True)
class BenchSummary:
    context: Mapping[str, Any]  # what was measured, where (from the first row)
    systems: Mapping[str, Mapping[str, Spread]]  # system -> figure -> spread, in run order
    ratios: Mapping[str, Spread]  # peer -> our generated tokens/s over the peer's
    floor_seconds: float | None
    floor_generated_tokens_per_second: float | None
    wall_over_floor: Spread | None  # our wall time / the floor, per repeat

    def figure(self, system: str, name: str) -> Spread | None:
        return self.systems.get(system, {}).get(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "context": dict(self.context),
            "systems": {
                system: {name: spread.to_dict() for name, spread in figures.items()}
                for system, figures in self.systems.items()
            },
            "ratios": {peer: spread.to_dict() for peer, spread in self.ratios.items()},
            "floor": {
                "seconds": self.floor_seconds,
                "generated_tokens_per_second": self.floor_generated_tokens_per_second,
                "wall_over_floor": self.wall_over_floor.to_dict() if self.wall_over_floor else None,
            },
        }


def summarize(rows: Sequence[Mapping[str, Any]]) -> BenchSummary:
    if not rows:
        raise InputError("no benchmark rows to summarize")
    measured = [row for row in rows if row["system"] != FLOOR]
    systems: dict[str, dict[str, Spread]] = {}
    for system in _in_order(row["system"] for row in measured):
        own = [row for row in measured if row["system"] == system]
        figures = {name: Spread.of(row.get(name) for row in own) for name in FIGURES}
        systems[system] = {name: spread for name, spread in figures.items() if spread}
    ours = _by_repeat(measured, OURS)
    ratios = {}
    rate = throughput_figure(rows[0])
    for peer in systems:
        if peer == OURS:
            continue
        theirs = _by_repeat(measured, peer)
        pairs = [ours[r][rate] / theirs[r][rate] for r in sorted(set(ours) & set(theirs))]
        spread = Spread.of(pairs)
        if spread is not None:
            ratios[peer] = spread
    floor = next((row for row in rows if row["system"] == FLOOR), None)
    floor_seconds = floor["wall_seconds"] if floor else None
    return BenchSummary(
        context={name: rows[0].get(name) for name in CONTEXT},
        systems=systems,
        ratios=ratios,
        floor_seconds=floor_seconds,
        floor_generated_tokens_per_second=floor["generated_tokens_per_second"] if floor else None,
        wall_over_floor=(
            Spread.of(row["wall_seconds"] / floor_seconds for row in ours.values())
            if floor_seconds
            else None
        ),
    )


def throughput_figure(row: Mapping[str, Any]) -> str:
    """What a workload's ratios compare: pairs/s for scoring, else generated tokens/s."""
    return "pairs_per_second" if row.get("pairs") is not None else "generated_tokens_per_second"


def _by_repeat(rows: Sequence[Mapping[str, Any]], system: str) -> dict[int, Mapping[str, Any]]:
    return {row["repeat"]: row for row in rows if row["system"] == system}


def _in_order(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
