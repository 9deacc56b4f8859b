"""The report's plots, drawn by matplotlib's SVG backend into inline `<svg>` text.

Figures are made with `matplotlib.figure.Figure` (no pyplot: no global figure state), text
stays text in the SVG (`svg.fonttype: none`, so the page's fonts draw it) and ids are salted
by the plot's name, so a report is the same bytes for the same job.
"""

from __future__ import annotations

import io
import itertools
import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np

from astrai_batch.jobs.output.timeline import Timeline
from astrai_batch.report.bench_history import BenchPoint

INK = "#1f2933"
MUTED = "#7b8794"
GRID = "#e4e7eb"
BLUE = "#2f6fde"
TEAL = "#14a38b"
ORANGE = "#e8833a"
RED = "#d64545"
PALETTE = (BLUE, ORANGE, TEAL, "#8e5bd9", RED, "#c29b0c", "#3aa3d6", "#6b7c2f")
WIDE = 12.0  # inches of a plot across the page (the side column's are 7.6)
REASON_COLORS = {"stop": TEAL, "length": BLUE, "error": RED}

STYLE: dict[str, Any] = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 9.5,
    "axes.edgecolor": MUTED,
    "axes.labelcolor": INK,
    "axes.titlecolor": INK,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": GRID,
    "grid.linewidth": 0.8,
    "xtick.color": MUTED,
    "ytick.color": MUTED,
    "xtick.labelcolor": INK,
    "ytick.labelcolor": INK,
    "legend.frameon": False,
    "legend.fontsize": 8.5,
}


def svg_of(name: str, draw: Callable[[Any], None], size: tuple[float, float]) -> str:
    """`draw(figure)` on a new figure of `size` inches; its SVG element as text."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context({**STYLE, "svg.hashsalt": name}):
        figure = Figure(figsize=size, layout="constrained")
        FigureCanvasSVG(figure)
        draw(figure)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    svg = text[text.index("<svg") :]
    # The RDF block names Dublin Core and Creative Commons vocabularies: nothing a page needs.
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)
    # Scale with the page: the viewBox keeps the proportions.
    return svg.replace('width="', 'data-width="', 1).replace('height="', 'data-height="', 1)


def _run_marks(axes: Any, timeline: Timeline) -> None:
    """A dashed line where a resumed run took over."""
    points = timeline.points
    for before, after in itertools.pairwise(points):
        if after.run != before.run:
            axes.axvline(before.end, color=MUTED, linestyle="--", linewidth=1)
            axes.annotate(
                "resumed",
                (before.end, 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                color=MUTED,
                fontsize=8,
            )


def _times(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Each point's stretch as (starts, ends) in job seconds."""
    ends = np.array([p.end for p in timeline.points])
    starts = ends - np.array([p.seconds for p in timeline.points])
    return starts, ends


def _steps(starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> tuple[Any, Any]:
    """A step curve: each value held over its stretch."""
    xs = np.column_stack([starts, ends]).ravel()
    ys = np.repeat(values, 2)
    return xs, ys


def throughput_svg(timeline: Timeline) -> str:
    def draw(figure: Any) -> None:
        axes = figure.subplots()
        starts, ends = _times(timeline)
        rates = np.array([p.tokens_per_second for p in timeline.points])
        xs, ys = _steps(starts, ends, rates)
        axes.fill_between(xs, ys, color=BLUE, alpha=0.12, linewidth=0)
        axes.plot(xs, ys, color=BLUE, linewidth=1.6)
        total = sum(p.decode_tokens for p in timeline.points)
        busy = sum(p.seconds for p in timeline.points)
        if busy > 0:
            mean = total / busy
            axes.axhline(mean, color=INK, linewidth=0.9, linestyle=":")
            axes.annotate(
                f"mean {mean:,.0f} tok/s",
                (0, mean),
                xycoords=("axes fraction", "data"),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize=8.5,
                color=INK,
            )
        _run_marks(axes, timeline)
        axes.set_xlabel("job time (s)")
        axes.set_ylabel("tokens / s")
        axes.set_ylim(bottom=0)
        axes.set_xlim(left=0)

    return svg_of("throughput", draw, (7.6, 2.8))


def occupancy_svg(timeline: Timeline) -> str:
    def draw(figure: Any) -> None:
        top, bottom = figure.subplots(2, 1, sharex=True)
        starts, ends = _times(timeline)
        batch = np.array([p.batch for p in timeline.points])
        xs, ys = _steps(starts, ends, batch)
        top.plot(xs, ys, color=ORANGE, linewidth=1.6, label="sequences per step (mean)")
        top.axhline(timeline.max_num_seqs, color=MUTED, linestyle="--", linewidth=1)
        top.annotate(
            f"--max-num-seqs {timeline.max_num_seqs}",
            (1, timeline.max_num_seqs),
            xycoords=("axes fraction", "data"),
            xytext=(-4, -11),
            textcoords="offset points",
            ha="right",
            fontsize=8,
            color=MUTED,
        )
        top.set_ylim(0, timeline.max_num_seqs * 1.12)
        top.set_ylabel("sequences / step")
        top.legend(loc="upper left")
        pages = max(timeline.kv_pages, 1)
        used = np.array([p.kv_pages_in_use for p in timeline.points]) / pages * 100
        cached = np.array([p.kv_cached_pages for p in timeline.points]) / pages * 100
        xs, cached_ys = _steps(starts, ends, cached)
        _, used_ys = _steps(starts, ends, used)
        bottom.fill_between(xs, cached_ys, color=TEAL, alpha=0.15, linewidth=0)
        bottom.plot(xs, cached_ys, color=TEAL, linewidth=1.2, label="held by the prefix cache")
        bottom.plot(xs, used_ys, color=BLUE, linewidth=1.6, label="held by running sequences")
        bottom.set_ylim(0, 105)
        bottom.set_ylabel(f"% of {timeline.kv_pages:,} pages")
        bottom.set_xlabel("job time (s)")
        bottom.set_xlim(left=0)
        bottom.legend(loc="upper left", ncols=2)
        for axes in (top, bottom):
            _run_marks(axes, timeline)

    return svg_of("occupancy", draw, (7.6, 4.0))


def lengths_svg(prompt: np.ndarray, completion: np.ndarray) -> str:
    def draw(figure: Any) -> None:
        left, right = figure.subplots(1, 2)
        for axes, values, color, title in (
            (left, prompt, BLUE, "Prompt length"),
            (right, completion, ORANGE, "Completion length"),
        ):
            if values.size:
                bins = _bins(values)
                axes.hist(values, bins=bins, color=color, alpha=0.85, edgecolor="white")
                median = float(np.median(values))
                axes.axvline(median, color=INK, linestyle=":", linewidth=1)
                axes.annotate(
                    f"median {median:,.0f}",
                    (median, 1),
                    xycoords=("data", "axes fraction"),
                    xytext=(4, -12),
                    textcoords="offset points",
                    fontsize=8.5,
                )
            axes.set_title(title)
            axes.set_xlabel("tokens")
            axes.set_ylabel("rows")

    return svg_of("lengths", draw, (WIDE, 3.0))


def _bins(values: np.ndarray) -> np.ndarray:
    """One bar per length when they span fewer than 60 tokens, else 40 even bars."""
    low, high = int(values.min()), int(values.max())
    if high - low < 60:
        return np.arange(low, high + 2) - 0.5
    return np.histogram_bin_edges(values, bins=40)


def finish_reasons_svg(reasons: Counter[str]) -> str:
    def draw(figure: Any) -> None:
        axes = figure.subplots()
        items = sorted(reasons.items(), key=lambda item: item[1])
        names = [name for name, _ in items]
        counts = [count for _, count in items]
        total = sum(counts) or 1
        colors = [REASON_COLORS.get(name, MUTED) for name in names]
        bars = axes.barh(names, counts, color=colors, height=0.6)
        for bar, count in zip(bars, counts, strict=True):
            axes.annotate(
                f"{count:,} ({count / total:.1%})",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8.5,
            )
        axes.set_xlim(0, max(counts or [1]) * 1.3)
        axes.grid(axis="y", visible=False)
        axes.set_xlabel("rows")

    height = 1.0 + 0.38 * max(len(reasons), 1)
    return svg_of("finish-reasons", draw, (4.4, height))


def bench_history_svg(series: dict[tuple[str, str], list[BenchPoint]]) -> str:
    def draw(figure: Any) -> None:
        axes = figure.subplots()
        units = sorted({p.unit for points in series.values() for p in points})
        dated = all(_when(p.started_at) for points in series.values() for p in points)
        order = sorted({p.started_at for points in series.values() for p in points})
        for number, ((workload, system), points) in enumerate(sorted(series.items())):
            times = [_when(p.started_at) if dated else order.index(p.started_at) for p in points]
            values = [p.value for p in points]
            axes.plot(
                times,
                values,
                marker="o",
                markersize=4,
                linewidth=1.5,
                color=PALETTE[number % len(PALETTE)],
                label=f"{workload} · {system}",
            )
        axes.set_ylabel(" or ".join(units))
        axes.set_ylim(bottom=0)
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        if dated:
            figure.autofmt_xdate()
        else:
            axes.set_xlabel("invocation")

    return svg_of("bench-history", draw, (WIDE, 3.4))


def _when(started_at: str) -> datetime | None:
    try:
        return datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        return None
