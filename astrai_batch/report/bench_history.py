"""Throughput across `astrai-batch bench` result files: the regression picture.

Each file is one invocation (`started_at`); each (workload, system) in it gives one point,
the median over its repeats of generated tokens per second (pairs per second for the
scoring workload). The computed `floor` rows are left out: they are a bound, not a run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from astrai_batch.bench.results import read_results


@dataclass(frozen=True)
class BenchPoint:
    started_at: str  # UTC ISO time of the invocation
    source: str  # the file it came from
    value: float
    unit: str  # "tokens/s" or "pairs/s"
    cpu: str | None
    device: str | None


def bench_history(paths: list[str]) -> dict[tuple[str, str], list[BenchPoint]]:
    """(workload, system) -> its points in time order, over every file in `paths`."""
    series: dict[tuple[str, str], list[BenchPoint]] = defaultdict(list)
    for path in paths:
        groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for row in read_results(path):
            if row.get("system") in (None, "floor"):
                continue
            groups[(str(row.get("workload")), str(row["system"]))].append(row)
        for key, rows in groups.items():
            scoring = rows[0].get("pairs_per_second") is not None
            name = "pairs_per_second" if scoring else "generated_tokens_per_second"
            values = [float(row[name]) for row in rows if row.get(name) is not None]
            if not values:
                continue
            series[key].append(
                BenchPoint(
                    started_at=str(rows[0].get("started_at") or ""),
                    source=path,
                    value=statistics.median(values),
                    unit="pairs/s" if scoring else "tokens/s",
                    cpu=rows[0].get("cpu_model"),
                    device=rows[0].get("device"),
                )
            )
    return {key: sorted(points, key=lambda p: p.started_at) for key, points in series.items()}
