"""`--baseline`: did a tracked figure get worse than in an earlier results file?

Tracked figures (medians over repeats):

* `astrai.generated_tokens_per_second` and `ratio.<peer>` (our generated tokens/s over the
  peer's): higher is better; a regression is falling below baseline * (1 - tolerance);
* `astrai.prefill_ratio` (prefill computed / ideal): lower is better; a regression is rising
  above baseline * (1 + tolerance);
* `astrai.engine_overhead` (a share of wall time): lower is better, compared in points; a
  regression is rising above baseline + tolerance (5% lets 8% overhead grow to 13%).

A figure absent on either side (a peer not run, say) is skipped, not failed. The command
exits with `EXIT_REGRESSION` when any compared figure regressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from astrai_batch.bench.config import OURS, PEER_NAMES
from astrai_batch.bench.summary import BenchSummary

EXIT_REGRESSION = 4
# Context that should match for a comparison to mean much; a difference is reported, and
# the comparison still runs (a new CPU is exactly what a team may want to compare against).
MATCHED_CONTEXT = (
    "workload",
    "model",
    "dtype",
    "num_prompts",
    "max_tokens",
    "prompt_tokens",
    "page_size",
    "cpu_model",
    "device",
)


@dataclass(frozen=True)
class TrackedFigure:
    name: str
    better: Literal["higher", "lower"]
    in_points: bool  # a share compared by difference rather than by ratio


TRACKED = (
    TrackedFigure(f"{OURS}.generated_tokens_per_second", "higher", in_points=False),
    TrackedFigure(f"{OURS}.prefill_ratio", "lower", in_points=False),
    TrackedFigure(f"{OURS}.engine_overhead", "lower", in_points=True),
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
    skipped: tuple[str, ...]  # tracked figures missing on one side
    context_differences: tuple[str, ...]

    @property
    def regressions(self) -> tuple[FigureComparison, ...]:
        return tuple(comparison for comparison in self.compared if comparison.regressed)

    @property
    def exit_code(self) -> int:
        return EXIT_REGRESSION if self.regressions else 0

    def lines(self) -> list[str]:
        """Human-readable lines for stderr: context differences, regressions, a verdict."""
        out = [f"baseline: {difference}" for difference in self.context_differences]
        out += [f"regression: {comparison.describe()}" for comparison in self.regressions]
        if self.skipped:
            out.append(f"baseline: not compared (missing on one side): {', '.join(self.skipped)}")
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
            "skipped": list(self.skipped),
            "context_differences": list(self.context_differences),
            "exit_code": self.exit_code,
        }


def compare_to_baseline(
    current: BenchSummary, baseline: BenchSummary, tolerance: float
) -> BaselineComparison:
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
    now, before = tracked_values(current), tracked_values(baseline)
    compared = tuple(
        FigureComparison(figure, before[figure.name], now[figure.name], tolerance)
        for figure in TRACKED
        if figure.name in now and figure.name in before
    )
    skipped = tuple(
        figure.name for figure in TRACKED if (figure.name in now) != (figure.name in before)
    )
    differences = tuple(
        f"{key} differs: {baseline.context.get(key)!r} then, {current.context.get(key)!r} now"
        for key in MATCHED_CONTEXT
        if baseline.context.get(key) != current.context.get(key)
    )
    return BaselineComparison(tolerance, compared, skipped, differences)
