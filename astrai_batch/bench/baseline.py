"""`--baseline`: did a tracked figure get worse than in an earlier results file?

Tracked figures (medians over repeats), for each of our systems present (`astrai`, the paged
layout, and `astrai-contiguous`):

* `<system>.generated_tokens_per_second` (`<system>.pairs_per_second` for the scoring
  workload) and `ratio.<peer>` (`astrai`'s over the peer's): higher is better; a regression
  is falling below baseline * (1 - tolerance);
* `<system>.prefill_ratio` (prefill computed / ideal): lower is better; a regression is rising
  above baseline * (1 + tolerance);
* `<system>.engine_overhead` (a share of wall time): lower is better, compared in points; a
  regression is rising above baseline + tolerance (5% lets 8% overhead grow to 13%).

The gate is honest: it passes only when every tracked figure of either side was compared
and held. Results that measure different work (another workload fingerprint, model, dtype,
device kind, max tokens or set of KV layouts), a tracked figure present on one side only,
or no tracked figure at all make the two results not comparable, a usage error
(`EXIT_NOT_COMPARABLE`), never a silent pass. Other context differences (another CPU, other
library versions) are reported and compared through: that is what a team may want to know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from astrai_batch.bench.config import OURS_SYSTEMS, PEER_NAMES
from astrai_batch.bench.summary import BenchSummary

EXIT_REGRESSION = 4
EXIT_NOT_COMPARABLE = 2  # click's usage-error code
# Context that must match for a comparison to mean anything.
REQUIRED_CONTEXT = (
    "workload_fingerprint",
    "model",
    "dtype",
    "device_kind",
    "max_tokens",
    "kv_layouts",
)
# Context that is reported when it differs; the comparison still runs.
REPORTED_CONTEXT = ("workload", "page_size", "cpu_model", "device", "torch_version")


@dataclass(frozen=True)
class TrackedFigure:
    name: str
    better: Literal["higher", "lower"]
    in_points: bool  # a share compared by difference rather than by ratio


TRACKED = (
    *(
        figure
        for system in OURS_SYSTEMS
        for figure in (
            TrackedFigure(f"{system}.generated_tokens_per_second", "higher", in_points=False),
            TrackedFigure(f"{system}.pairs_per_second", "higher", in_points=False),
            TrackedFigure(f"{system}.prefill_ratio", "lower", in_points=False),
            TrackedFigure(f"{system}.engine_overhead", "lower", in_points=True),
        )
    ),
    *(TrackedFigure(f"ratio.{peer}", "higher", in_points=False) for peer in PEER_NAMES),
)


def tracked_values(summary: BenchSummary) -> dict[str, float]:
    """The tracked figures a summary has, by name."""
    values: dict[str, float] = {}
    for figure in TRACKED:
        kind, _, name = figure.name.partition(".")
        spread = summary.ratios.get(name) if kind == "ratio" else summary.figure(kind, name)
        if spread is not None:
            values[figure.name] = spread.median
    return values


@dataclass(frozen=True)
class FigureComparison:
    figure: TrackedFigure
    baseline: float
    current: float
    tolerance: float

    @property
    def change(self) -> float:
        """Relative change, or the difference in points for a share."""
        if self.figure.in_points:
            return self.current - self.baseline
        return self.current / self.baseline - 1.0 if self.baseline else 0.0

    @property
    def regressed(self) -> bool:
        worse = -self.change if self.figure.better == "higher" else self.change
        return worse > self.tolerance

    def describe(self) -> str:
        if self.figure.in_points:
            change = f"{self.change * 100:+.1f} points"
            values = f"{self.baseline:.1%} -> {self.current:.1%}"
        else:
            change = f"{self.change:+.1%}"
            values = f"{self.baseline:.4g} -> {self.current:.4g}"
        return (
            f"{self.figure.name}: {values} ({change}; {self.figure.better} is better, "
            f"tolerance {self.tolerance:.0%})"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "figure": self.figure.name,
            "baseline": self.baseline,
            "current": self.current,
            "change": self.change,
            "regressed": self.regressed,
        }


@dataclass(frozen=True)
class BaselineComparison:
    tolerance: float
    compared: tuple[FigureComparison, ...]
    not_comparable: tuple[str, ...]  # why the two results cannot be compared; empty if they can
    context_differences: tuple[str, ...]  # reported only

    @property
    def regressions(self) -> tuple[FigureComparison, ...]:
        return tuple(comparison for comparison in self.compared if comparison.regressed)

    @property
    def exit_code(self) -> int:
        if self.not_comparable:
            return EXIT_NOT_COMPARABLE
        return EXIT_REGRESSION if self.regressions else 0

    def reason(self) -> str:
        """The usage error's message when the results are not comparable."""
        return "not comparable with the baseline: " + "; ".join(self.not_comparable)

    def lines(self) -> list[str]:
        """Human-readable lines for stderr: context differences, regressions, a verdict."""
        out = [f"baseline: {difference}" for difference in self.context_differences]
        if self.not_comparable:
            return [*out, f"baseline: {self.reason()}"]
        out += [f"regression: {comparison.describe()}" for comparison in self.regressions]
        verdict = (
            f"{len(self.regressions)} of {len(self.compared)} tracked figures regressed"
            if self.regressions
            else f"no regression in {len(self.compared)} tracked figures"
        )
        out.append(f"baseline: {verdict} (tolerance {self.tolerance:.0%})")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "tolerance": self.tolerance,
            "compared": [comparison.to_dict() for comparison in self.compared],
            "regressions": [comparison.figure.name for comparison in self.regressions],
            "not_comparable": list(self.not_comparable),
            "context_differences": list(self.context_differences),
            "exit_code": self.exit_code,
        }


def compare_to_baseline(
    current: BenchSummary, baseline: BenchSummary, tolerance: float
) -> BaselineComparison:
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
    now, before = tracked_values(current), tracked_values(baseline)
    problems = [
        _context_problem(key, _context(baseline, key), _context(current, key))
        for key in REQUIRED_CONTEXT
        if _context(baseline, key) != _context(current, key)
    ]
    for figure in TRACKED:
        if figure.name in before and figure.name not in now:
            problems.append(f"{figure.name} is in the baseline but not in these results")
        elif figure.name in now and figure.name not in before:
            problems.append(f"{figure.name} is in these results but not in the baseline")
    compared = tuple(
        FigureComparison(figure, before[figure.name], now[figure.name], tolerance)
        for figure in TRACKED
        if figure.name in now and figure.name in before
    )
    if not compared:
        problems.append("no tracked figure is in both results")
    differences = tuple(
        f"{key} differs: {_context(baseline, key)!r} then, {_context(current, key)!r} now"
        for key in REPORTED_CONTEXT
        if _context(baseline, key) != _context(current, key)
    )
    return BaselineComparison(tolerance, compared, tuple(problems), differences)


def _context(summary: BenchSummary, key: str) -> Any:
    if key == "device_kind":  # "cuda:0 NVIDIA H200" -> "cuda"
        device = summary.context.get("device")
        return device.partition(":")[0] if isinstance(device, str) else None
    return summary.context.get(key)


def _context_problem(key: str, before: Any, now: Any) -> str:
    if before is None:
        return f"the baseline records no {key} (an older results file?)"
    if now is None:
        return f"these results record no {key}"
    return f"{key} differs ({before!r} then, {now!r} now)"
