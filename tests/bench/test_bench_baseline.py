"""The regression gate and the summary it reads: pairwise ratios, directions, tolerances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from astrai_batch.bench.baseline import (
    EXIT_NOT_COMPARABLE,
    EXIT_REGRESSION,
    compare_to_baseline,
    tracked_values,
)
from astrai_batch.bench.results import read_results, write_results
from astrai_batch.bench.summary import Spread, summarize
from astrai_batch.errors import InputError

CONTEXT = {
    "workload": "shared-prefix",
    "workload_fingerprint": "0123456789abcdef",
    "model": "smollm2-135m",
    "dtype": "float32",
    "device": "cpu",
    "max_tokens": 64,
    "kv_layouts": "paged",
}


def row(system: str, repeat: int | None, **figures: Any) -> dict[str, Any]:
    return {"system": system, "repeat": repeat, **CONTEXT, **figures}


def bench_rows(
    ours_rates: tuple[float, ...] = (400.0, 500.0, 300.0),
    peer_rates: tuple[float, ...] = (100.0, 50.0, 100.0),
    prefill_ratio: float = 1.0,
    overhead: float = 0.10,
) -> list[dict[str, Any]]:
    """Alternating ours / hf-generate rows, as a run with three repeats writes them."""
    rows = []
    for repeat, (ours, peer) in enumerate(zip(ours_rates, peer_rates, strict=True)):
        rows.append(
            row(
                "astrai",
                repeat,
                wall_seconds=1.0,
                generated_tokens_per_second=ours,
                prefill_ratio=prefill_ratio,
                engine_overhead=overhead,
            )
        )
        rows.append(row("hf-generate", repeat, wall_seconds=1.0, generated_tokens_per_second=peer))
    rows.append(row("floor", None, wall_seconds=0.5, generated_tokens_per_second=800.0))
    return rows


def test_ratios_are_the_median_of_per_repeat_pairs_not_a_ratio_of_medians() -> None:
    summary = summarize(bench_rows(peer_rates=(100.0, 50.0, 60.0)))
    # per repeat 400/100, 500/50, 300/60 = 4, 10, 5; the ratio of medians would be 400/60
    assert summary.ratios["hf-generate"] == Spread(median=5.0, low=4.0, high=10.0, count=3)
    assert summary.figure("hf-generate", "generated_tokens_per_second") == Spread(
        median=60.0, low=50.0, high=100.0, count=3
    )


def test_floor_row_gives_the_floor_and_our_wall_over_it() -> None:
    summary = summarize(bench_rows())
    assert summary.floor_seconds == 0.5
    assert summary.floor_generated_tokens_per_second == 800.0
    assert summary.wall_over_floor == Spread(median=2.0, low=2.0, high=2.0, count=3)
    assert "floor" not in summary.systems


def test_tracked_values_are_medians_of_the_figures_present() -> None:
    assert tracked_values(summarize(bench_rows())) == {
        "astrai.generated_tokens_per_second": 400.0,
        "astrai.prefill_ratio": 1.0,
        "astrai.engine_overhead": 0.10,
        "ratio.hf-generate": 4.0,
    }


@pytest.mark.parametrize(
    ("current", "regressed"),
    [
        # generated tokens/s, higher is better: 5% below is the limit
        ({"ours_rates": (381.0, 381.0, 381.0), "peer_rates": (95.25,) * 3}, []),
        (
            {"ours_rates": (379.0, 379.0, 379.0), "peer_rates": (94.75,) * 3},
            ["astrai.generated_tokens_per_second"],
        ),
        # the ratio to a peer, higher is better
        (
            {"ours_rates": (400.0,) * 3, "peer_rates": (106.0,) * 3},
            ["ratio.hf-generate"],
        ),
        # prefill ratio, lower is better, relative
        ({"prefill_ratio": 1.04}, []),
        ({"prefill_ratio": 1.06}, ["astrai.prefill_ratio"]),
        # overhead, lower is better, in points: 10% may grow to 15%
        ({"overhead": 0.149}, []),
        ({"overhead": 0.151}, ["astrai.engine_overhead"]),
        # better everywhere is never a regression
        ({"ours_rates": (900.0,) * 3, "prefill_ratio": 0.5, "overhead": 0.01}, []),
    ],
)
def test_each_tracked_figure_regresses_in_its_own_direction(
    current: dict[str, Any], regressed: list[str]
) -> None:
    baseline = summarize(bench_rows(ours_rates=(400.0,) * 3, peer_rates=(100.0,) * 3))
    comparison = compare_to_baseline(summarize(bench_rows(**current)), baseline, 0.05)
    assert [c.figure.name for c in comparison.regressions] == regressed
    assert comparison.exit_code == (EXIT_REGRESSION if regressed else 0)
    assert len(comparison.compared) == 4


def test_regression_lines_say_what_changed_and_context_differences() -> None:
    baseline_rows = bench_rows(ours_rates=(400.0,) * 3, peer_rates=(100.0,) * 3)
    current_rows = bench_rows(ours_rates=(300.0,) * 3, peer_rates=(100.0,) * 3)
    for r in current_rows:
        r["cpu_model"] = "Faster CPU"
    comparison = compare_to_baseline(summarize(current_rows), summarize(baseline_rows), 0.05)
    assert comparison.lines() == [
        "baseline: cpu_model differs: None then, 'Faster CPU' now",
        "regression: astrai.generated_tokens_per_second: 400 -> 300 (-25.0%; higher is better,"
        " tolerance 5%)",
        "regression: ratio.hf-generate: 4 -> 3 (-25.0%; higher is better, tolerance 5%)",
        "baseline: 2 of 4 tracked figures regressed (tolerance 5%)",
    ]


def test_figures_missing_on_one_side_make_the_results_not_comparable() -> None:
    without_peer = [r for r in bench_rows() if r["system"] != "hf-generate"]
    comparison = compare_to_baseline(summarize(without_peer), summarize(bench_rows()), 0.05)
    assert comparison.not_comparable == (
        "ratio.hf-generate is in the baseline but not in these results",
    )
    assert comparison.exit_code == EXIT_NOT_COMPARABLE == 2
    assert comparison.lines() == [
        "baseline: not comparable with the baseline: ratio.hf-generate is in the baseline "
        "but not in these results"
    ]
    reverse = compare_to_baseline(summarize(bench_rows()), summarize(without_peer), 0.05)
    assert reverse.not_comparable == (
        "ratio.hf-generate is in these results but not in the baseline",
    )


@pytest.mark.parametrize(
    ("key", "then", "now", "reason"),
    [
        (
            "workload_fingerprint",
            "0123456789abcdef",
            "fedcba9876543210",
            "workload_fingerprint differs ('0123456789abcdef' then, 'fedcba9876543210' now)",
        ),
        ("model", "smollm2-135m", "qwen", "model differs ('smollm2-135m' then, 'qwen' now)"),
        ("dtype", "float32", "bfloat16", "dtype differs ('float32' then, 'bfloat16' now)"),
        ("device", "cpu", "cuda:0 NVIDIA H200", "device_kind differs ('cpu' then, 'cuda' now)"),
        ("max_tokens", 64, 32, "max_tokens differs (64 then, 32 now)"),
        (
            "kv_layouts",
            "paged",
            "contiguous,paged",
            "kv_layouts differs ('paged' then, 'contiguous,paged' now)",
        ),
        (
            "workload_fingerprint",
            None,
            "0123456789abcdef",
            "the baseline records no workload_fingerprint (an older results file?)",
        ),
    ],
)
def test_results_of_other_work_are_not_comparable(
    key: str, then: Any, now: Any, reason: str
) -> None:
    baseline_rows, current_rows = bench_rows(), bench_rows()
    for r in baseline_rows:
        r[key] = then
    for r in current_rows:
        r[key] = now
    comparison = compare_to_baseline(summarize(current_rows), summarize(baseline_rows), 0.05)
    assert comparison.not_comparable == (reason,)
    assert comparison.exit_code == 2
    assert comparison.reason() == f"not comparable with the baseline: {reason}"


def test_another_device_of_the_same_kind_is_only_reported() -> None:
    baseline_rows, current_rows = bench_rows(), bench_rows()
    for r in baseline_rows:
        r["device"] = "cuda:0 NVIDIA A100"
    for r in current_rows:
        r["device"] = "cuda:0 NVIDIA H200"
    comparison = compare_to_baseline(summarize(current_rows), summarize(baseline_rows), 0.05)
    assert comparison.exit_code == 0
    assert comparison.lines() == [
        "baseline: device differs: 'cuda:0 NVIDIA A100' then, 'cuda:0 NVIDIA H200' now",
        "baseline: no regression in 4 tracked figures (tolerance 5%)",
    ]


def test_no_tracked_figure_on_either_side_is_not_a_pass() -> None:
    peers_only = [r for r in bench_rows() if r["system"] == "hf-generate"]
    comparison = compare_to_baseline(summarize(peers_only), summarize(peers_only), 0.05)
    assert comparison.compared == ()
    assert comparison.not_comparable == ("no tracked figure is in both results",)
    assert comparison.exit_code == 2


def test_each_layout_is_tracked_under_its_own_name() -> None:
    rows = bench_rows()
    rows.insert(
        1,
        row("astrai-contiguous", 0, wall_seconds=1.0, generated_tokens_per_second=200.0),
    )
    for r in rows:
        r["kv_layouts"] = "paged,contiguous"
    values = tracked_values(summarize(rows))
    assert values["astrai-contiguous.generated_tokens_per_second"] == 200.0
    slower = [dict(r) for r in rows]
    slower[1]["generated_tokens_per_second"] = 150.0
    comparison = compare_to_baseline(summarize(slower), summarize(rows), 0.05)
    assert [c.figure.name for c in comparison.regressions] == [
        "astrai-contiguous.generated_tokens_per_second"
    ]
    assert comparison.exit_code == EXIT_REGRESSION


def test_results_round_trip_through_parquet(tmp_path: Path) -> None:
    path = tmp_path / "results.parquet"
    write_results(path, bench_rows())
    rows = read_results(path)
    assert len(rows) == 7
    assert summarize(rows) == summarize(bench_rows())


def test_a_parquet_file_that_is_not_bench_results_is_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["b"]}), path)
    with pytest.raises(InputError) as error:
        read_results(path)
    assert str(error.value) == (
        f"{path} is not an astrai-batch bench results file (no system, repeat column)"
    )
