"""The human table (stderr) and the JSON summary (stdout) of a benchmark."""

from __future__ import annotations

import json
from typing import Any

from astrai_batch.bench.baseline import BaselineComparison, tracked_values
from astrai_batch.bench.config import FLOOR, OURS, OURS_SYSTEMS
from astrai_batch.bench.roofline import Roofline
from astrai_batch.bench.summary import BenchSummary, Spread

_HEADER = ("system", "wall s", "gen tok/s", "total tok/s", "peak RSS", "astrai is")
_SCORING_HEADER = ("system", "wall s", "pairs/s", "pair tok/s", "peak RSS", "astrai is")


def summary_json(summary: BenchSummary, comparison: BaselineComparison | None) -> str:
    body: dict[str, Any] = summary.to_dict()
    body["tracked"] = tracked_values(summary)
    body["baseline"] = comparison.to_dict() if comparison is not None else None
    return json.dumps(body, indent=2, sort_keys=False)


def summary_table(summary: BenchSummary) -> str:
    context = summary.context
    ours = next((summary.systems[s] for s in OURS_SYSTEMS if s in summary.systems), {})
    repeats = ours["wall_seconds"].count if "wall_seconds" in ours else 0
    scoring = context.get("pairs") is not None
    work = (
        f"{context.get('num_prompts')} rows, {_int(context.get('pairs'))} pairs "
        f"({_int(context.get('prompt_tokens'))} pair tokens)"
        if scoring
        else f"{context.get('num_prompts')} prompts ({_int(context.get('prompt_tokens'))} prompt "
        f"tokens) x {context.get('max_tokens')} new tokens"
    )
    rate = "pairs_per_second" if scoring else "generated_tokens_per_second"
    title = (
        f"astrai-batch bench: {context.get('workload')}, {work}; "
        f"{context.get('model')} {context.get('dtype')} on {context.get('device')}, "
        f"{context.get('cpu_cores')} cores ({context.get('cpu_model')}); "
        f"{repeats} repeat{'s' if repeats != 1 else ''}"
        + (", median (min-max)" if repeats > 1 else "")
    )
    table = [_SCORING_HEADER if scoring else _HEADER]
    for system, figures in summary.systems.items():
        ratio = summary.ratios.get(system)
        table.append(
            (
                system,
                _spread(figures.get("wall_seconds"), ",.1f"),
                _spread(figures.get(rate), ",.1f"),
                _spread(figures.get("total_tokens_per_second"), ",.1f"),
                _bytes(figures.get("peak_rss_bytes")),
                f"{_spread(ratio, '.2f')}x faster" if ratio else "",
            )
        )
    if summary.floor_seconds is not None:
        over = summary.wall_over_floor
        table.append(
            (
                FLOOR,
                f"{summary.floor_seconds:,.1f}",
                f"{summary.floor_generated_tokens_per_second or 0:,.1f}",
                "",
                "",
                f"{_spread(over, '.2f')}x the floor" if over else "",
            )
        )
    lines = [title, *_aligned(table)]
    for system in OURS_SYSTEMS:
        if system in summary.systems:
            lines.extend(_engine_lines(summary, system))
            line = roofline_line(summary, system)
            if line:
                lines.append(f"{system} {line}")
    for system, figures in summary.systems.items():
        agree, leading = figures.get("greedy_agreement"), figures.get("greedy_leading_agreement")
        if agree is not None and leading is not None:
            lines.append(
                f"{system} greedy agreement with {OURS}: {_spread(agree, '.1%')} of tokens, "
                f"{_spread(leading, '.1%')} before each prompt's first difference"
            )
    return "\n".join(lines)


def roofline_line(summary: BenchSummary, system: str) -> str | None:
    """The roofline of a system's median run: its weight-GEMM FLOPs at the GEMM peak measured
    at bench start against its median wall, and the share of wall outside the forward."""
    figures = summary.systems[system]
    flops, peak = figures.get("weight_gemm_flops"), figures.get("gemm_peak_flops_per_second")
    wall, forward = figures.get("wall_seconds"), figures.get("forward_seconds")
    if flops is None or peak is None or wall is None:
        return None
    median_forward = forward.median if forward is not None else None
    return Roofline(flops.median, peak.median, wall.median, median_forward).line()


def _engine_lines(summary: BenchSummary, system: str) -> list[str]:
    ours = summary.systems[system]
    context = summary.context
    out = []
    seats, running = ours.get("kv_seats"), ours.get("peak_running_seqs")
    if running:
        held = f"{_spread(seats, ',.0f')} seats, " if seats else "pages on demand, "
        out.append(
            f"{system} KV memory: {held}{_spread(running, ',.0f')} sequences at once at peak, "
            f"peak KV pages {_spread(ours.get('peak_kv_pages'), ',.0f')}, "
            f"peak RSS {_bytes(ours.get('peak_rss_bytes'))}"
        )
    prefill = ours.get("prefill_tokens")
    ratio = ours.get("prefill_ratio")
    if prefill and ratio:
        out.append(
            f"{system} prefill: {_int(prefill.median)} tokens computed, "
            f"{_spread(ratio, '.3f')}x the ideal {_int(context.get('ideal_prefill_tokens'))}"
        )
    hit = ours.get("cache_hit_rate")
    if hit is not None:
        ideal = context.get("ideal_cache_hit_rate")
        out.append(
            f"{system} cache hit rate: {_spread(hit, '.1%')} (ideal {_percent(ideal)}); "
            f"peak KV pages {_spread(ours.get('peak_kv_pages'), ',.0f')}; "
            f"preemptions {_spread(ours.get('preemptions'), ',.0f')}"
        )
    ttft50, ttft90 = ours.get("ttft_p50_seconds"), ours.get("ttft_p90_seconds")
    if ttft50 and ttft90:
        out.append(
            f"{system} time to first token: p50 {_spread(ttft50, '.2f')} s, "
            f"p90 {_spread(ttft90, '.2f')} s"
        )
    overhead = ours.get("engine_overhead")
    forward, steps = ours.get("forward_seconds"), ours.get("step_seconds")
    if overhead and forward and steps:
        out.append(
            f"{system} engine overhead (wall outside the forward): {_spread(overhead, '.1%')}; "
            f"model forward {_spread(forward, ',.1f')} s, engine steps {_spread(steps, ',.1f')} s"
        )
    load = ours.get("load_average_1m")
    if load:
        out.append(f"load average (1 min) at run start: {_spread(load, '.2f')}")
    return out


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned first column, right-aligned figures, each as wide as its widest cell."""
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    return [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]


def _spread(spread: Spread | None, fmt: str) -> str:
    if spread is None:
        return ""
    if spread.count < 2:
        return format(spread.median, fmt)
    return f"{format(spread.median, fmt)} ({format(spread.low, fmt)}-{format(spread.high, fmt)})"


def _int(value: Any) -> str:
    return f"{int(value):,}" if value is not None else "?"


def _percent(value: Any) -> str:
    return f"{value:.1%}" if value is not None else "?"


def _bytes(spread: Spread | None) -> str:
    if spread is None:
        return ""
    return f"{spread.median / 1024**3:.2f} GiB"
