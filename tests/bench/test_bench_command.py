"""`astrai-batch bench` end to end on the tiny model: ours and both peers, the floor, the
results file, the JSON summary, and the exit codes of the baseline gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner, Result

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.prompts import load_prompts
from astrai_batch.bench.results import read_results, write_results
from astrai_batch.bench.roofline import Roofline, body_and_head
from astrai_batch.bench.workloads import WorkloadSpec, build_workload, write_workload_jsonl
from astrai_batch.cli import main
from astrai_batch.engine import load_model, load_tokenizer
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats

# The columns docs/bench.md documents for the results file, in order.
DOCUMENTED_COLUMNS = (
    "started_at",
    "system",
    "repeat",
    "workload",
    "workload_fingerprint",
    "model",
    "dtype",
    "seed",
    "num_prompts",
    "max_tokens",
    "prompt_tokens",
    "generated_tokens",
    "wall_seconds",
    "generated_tokens_per_second",
    "total_tokens_per_second",
    "pairs",
    "pairs_per_second",
    "ideal_prefill_tokens",
    "prefill_tokens",
    "prefill_ratio",
    "ideal_cache_hit_rate",
    "cache_hit_rate",
    "ttft_p50_seconds",
    "ttft_p90_seconds",
    "peak_kv_pages",
    "kv_pool_pages",
    "kv_layout",
    "attention_backend",
    "kv_seats",
    "peak_running_seqs",
    "peak_rss_bytes",
    "forward_seconds",
    "step_seconds",
    "engine_overhead",
    "steps",
    "preemptions",
    "weight_gemm_flops",
    "gemm_peak_flops_per_second",
    "greedy_agreement",
    "greedy_leading_agreement",
    "page_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "kv_layouts",
    "system_config",
    "load_average_1m",
    "cpu_model",
    "cpu_cores",
    "torch_threads",
    "device",
    "torch_version",
    "transformers_version",
    "astrai_batch_version",
    "python_version",
)
ENGINE_ONLY = (
    "prefill_tokens",
    "prefill_ratio",
    "cache_hit_rate",
    "ttft_p50_seconds",
    "ttft_p90_seconds",
    "peak_kv_pages",
    "kv_pool_pages",
    "kv_layout",
    "attention_backend",
    "peak_running_seqs",
    "forward_seconds",
    "step_seconds",
    "engine_overhead",
    "steps",
    "preemptions",
    "weight_gemm_flops",
    "gemm_peak_flops_per_second",
)
# 2 system prompts x 2 questions, 3 new tokens each: every path runs in a few seconds.
WORKLOAD_ARGS = (
    "--num-system-prompts",
    "2",
    "--questions-per-prompt",
    "2",
    "--system-prompt-words",
    "12",
    "--max-tokens",
    "3",
    "--kv-cache-memory",
    "8MiB",
)


def bench(*args: Any) -> Result:
    return CliRunner().invoke(main, ["bench", *(str(a) for a in args)], catch_exceptions=False)


def a_results_row(system: str, repeat: int | None, **figures: Any) -> dict[str, Any]:
    return {"system": system, "repeat": repeat, "workload": "shared-prefix", **figures}


@pytest.fixture(scope="module")
def full_run(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("bench") / "results.parquet"
    threads = torch.get_num_threads()
    try:
        result = bench(
            "--model", tiny_llama_dir, "--threads", "1", *WORKLOAD_ARGS, "--repeat", "1",
            "--kv-layout", "contiguous,paged", "--max-model-len", "256",
            "--peers", "hf-generate,hf-generate-batch", "--out", out,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide; later tests keep theirs
    return result, out


def baseline_from(out: Path, path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """A baseline file: the run's own rows, each passed through `change`."""
    rows = read_results(out)
    for row in rows:
        change(row)
    write_results(path, rows)
    return path


def test_the_run_exits_0_and_reports_each_layout(full_run: tuple[Result, Path]) -> None:
    result, _ = full_run
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    contiguous = next(line for line in lines if line.startswith("astrai-contiguous KV memory:"))
    # 8 MiB of 8 KiB pages = 1024 pages; a 256-token seat is 16 pages: 64 seats, capped at 256
    assert contiguous.startswith("astrai-contiguous KV memory: 64 seats, 4 sequences at once")
    paged = next(line for line in lines if line.startswith("astrai KV memory:"))
    assert paged.startswith("astrai KV memory: pages on demand, 4 sequences at once at peak")
    assert "astrai-contiguous cache hit rate: 0.0% (ideal " in result.stderr
    assert "hf-generate: probing batch sizes" in result.stderr


def test_regressed_baseline_exits_4_naming_the_figure(
    full_run: tuple[Result, Path], tmp_path: Path
) -> None:
    _, out = full_run

    def faster(row: dict[str, Any]) -> None:
        if row["system"] == "astrai":
            row["generated_tokens_per_second"] = 1e9

    baseline = baseline_from(out, tmp_path / "baseline.parquet", faster)
    result = bench("--from-results", out, "--baseline", baseline)
    assert result.exit_code == 4, result.stderr
    assert "regression: astrai.generated_tokens_per_second: 1e+09 -> " in result.stderr
    assert "baseline: 3 of 8 tracked figures regressed (tolerance 5%)" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["baseline"]["regressions"] == [
        "astrai.generated_tokens_per_second",
        "ratio.hf-generate",
        "ratio.hf-generate-batch",
    ]
    assert summary["baseline"]["exit_code"] == 4


def test_a_baseline_of_another_model_exits_2_with_the_reason(
    full_run: tuple[Result, Path], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    _, out = full_run
    baseline = baseline_from(
        out, tmp_path / "baseline.parquet", lambda row: row.update(model="other-model")
    )
    result = bench("--from-results", out, "--baseline", baseline)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: not comparable with the baseline: model differs "
        f"('other-model' then, '{tiny_llama_dir}' now)"
    )
    assert json.loads(result.stdout)["baseline"]["exit_code"] == 2


def test_a_baseline_without_a_peer_exits_2_naming_the_figure(
    full_run: tuple[Result, Path], tmp_path: Path
) -> None:
    _, out = full_run
    rows = [row for row in read_results(out) if row["system"] != "hf-generate"]
    baseline = tmp_path / "baseline.parquet"
    write_results(baseline, rows)
    result = bench("--from-results", out, "--baseline", baseline)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: not comparable with the baseline: ratio.hf-generate is in these results but "
        "not in the baseline"
    )


def test_results_file_has_the_documented_columns_and_one_row_per_system_and_repeat(
    full_run: tuple[Result, Path], tiny_llama_dir: Path
) -> None:
    _, out = full_run
    table = pq.read_table(out)
    assert tuple(table.column_names) == DOCUMENTED_COLUMNS
    rows = table.to_pylist()
    assert [(r["system"], r["repeat"], r["kv_layout"]) for r in rows] == [
        ("astrai-contiguous", 0, "contiguous"),
        ("astrai", 0, "paged"),
        ("hf-generate", 0, None),
        ("hf-generate-batch", 0, None),
        ("floor", None, None),
    ]
    assert [(r["kv_seats"], r["kv_layouts"], r["max_model_len"]) for r in rows] == [
        (64, "contiguous,paged", 256),
        (None, "contiguous,paged", 256),
        (None, "contiguous,paged", 256),
        (None, "contiguous,paged", 256),
        (None, "contiguous,paged", 256),
    ]
    assert [(r["system"], r["repeat"]) for r in rows][1:] == [
        ("astrai", 0),
        ("hf-generate", 0),
        ("hf-generate-batch", 0),
        ("floor", None),
    ]
    config = BenchConfig(
        model=str(tiny_llama_dir),
        num_system_prompts=2,
        questions_per_prompt=2,
        system_prompt_words=12,
        max_tokens=3,
    )
    tokenizer, _ = load_tokenizer(str(tiny_llama_dir))
    prompts = load_prompts(config, tokenizer, "tiny")
    ideal = ideal_prefix_stats(prompts.prompt_token_ids, page_size=16)
    for row in rows:
        assert (row["num_prompts"], row["max_tokens"], row["generated_tokens"]) == (4, 3, 12)
        assert row["prompt_tokens"] == prompts.prompt_tokens
        assert row["ideal_prefill_tokens"] == ideal.unique_tokens
        assert row["ideal_cache_hit_rate"] == ideal.predicted_prefill_saving
        assert row["generated_tokens_per_second"] == 12 / row["wall_seconds"]
        assert row["pairs"] is None and row["pairs_per_second"] is None  # scoring only
        assert row["cpu_cores"] >= 1 and row["torch_version"] and row["device"] == "cpu"
        assert row["torch_threads"] == 1
    contiguous, ours, hf_generate, hf_generate_batch, floor = rows
    assert contiguous["cache_hit_rate"] == 0.0 and ours["cache_hit_rate"] > 0
    assert contiguous["prefill_tokens"] == prompts.prompt_tokens
    assert {r["workload_fingerprint"] for r in rows} == {prompts.fingerprint}
    assert ours["engine_overhead"] == 1 - ours["forward_seconds"] / ours["wall_seconds"]
    assert ours["prefill_ratio"] == ours["prefill_tokens"] / ideal.unique_tokens
    assert ours["peak_kv_pages"] >= 1 and ours["peak_rss_bytes"] > 0
    for peer in (hf_generate, hf_generate_batch, floor):
        assert [peer[name] for name in ENGINE_ONLY] == [None] * len(ENGINE_ONLY)
    hf_config = json.loads(hf_generate["system_config"])
    # 4 prompts fill none of 16/32/64/128, so the probe tries one batch of all 4
    assert list(hf_config.pop("probe")) == ["4"]
    assert hf_config == {
        "batch_size": 4,
        "batch_size_from": "probe",
        "order": "by length",
        "padding": "left",
    }
    assert floor["peak_rss_bytes"] is None
    assert json.loads(floor["system_config"])["decode_tokens"] == 4 * (3 - 1)
    # the roofline: every computed token through the body, one LM-head row per generated one
    body, head = body_and_head(load_model(tiny_llama_dir).model)
    for run in (contiguous, ours):
        computed = run["prefill_tokens"] + 4 * (3 - 1)
        assert run["weight_gemm_flops"] == 2 * sum(k * n for k, n in body) * computed + (
            2 * head * 12
        )
    assert contiguous["gemm_peak_flops_per_second"] == ours["gemm_peak_flops_per_second"] > 0
    for peer in (hf_generate, hf_generate_batch, floor):  # they give no tokens to compare
        assert (peer["greedy_agreement"], peer["greedy_leading_agreement"]) == (None, None)


def test_json_summary_carries_ratios_floor_and_tracked_figures(
    full_run: tuple[Result, Path],
) -> None:
    result, out = full_run
    summary = json.loads(result.stdout)
    rows = read_results(out)
    ours, hf_generate = rows[1], rows[2]
    assert summary["ratios"]["hf-generate"]["median"] == (
        ours["generated_tokens_per_second"] / hf_generate["generated_tokens_per_second"]
    )
    assert sorted(summary["tracked"]) == [
        "astrai-contiguous.engine_overhead",
        "astrai-contiguous.generated_tokens_per_second",
        "astrai-contiguous.prefill_ratio",
        "astrai.engine_overhead",
        "astrai.generated_tokens_per_second",
        "astrai.prefill_ratio",
        "ratio.hf-generate",
        "ratio.hf-generate-batch",
    ]
    assert summary["floor"]["seconds"] == rows[4]["wall_seconds"]
    assert summary["context"]["num_prompts"] == 4
    for line in ("system", "astrai ", "hf-generate ", "hf-generate-batch ", "floor "):
        assert any(row.startswith(line) for row in result.stderr.splitlines()), line
    ours_figures = summary["systems"]["astrai"]
    line = Roofline(
        ours_figures["weight_gemm_flops"]["median"],
        ours_figures["gemm_peak_flops_per_second"]["median"],
        ours_figures["wall_seconds"]["median"],
        ours_figures["forward_seconds"]["median"],
    ).line()
    assert f"astrai {line}" in result.stderr.splitlines()
    assert "astrai-contiguous roofline: " in result.stderr


def test_an_equal_baseline_exits_0(full_run: tuple[Result, Path]) -> None:
    _, out = full_run
    result = bench("--from-results", out, "--baseline", out)
    assert result.exit_code == 0, result.stderr
    assert "baseline: no regression in 8 tracked figures (tolerance 5%)" in result.stderr
    assert json.loads(result.stdout)["baseline"]["regressions"] == []


def test_a_workload_file_runs_like_the_run_command_reads_it(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    spec = WorkloadSpec(
        "unique", num_system_prompts=1, questions_per_prompt=3, system_prompt_words=8
    )
    source = tmp_path / "rows.jsonl"
    write_workload_jsonl(build_workload(spec), source)
    out = tmp_path / "results.parquet"
    result = bench(
        "--model", tiny_llama_dir, "--workload", source, "--max-tokens", "2",
        "--kv-cache-memory", "8MiB", "--repeat", "2", "--no-warmup", "--no-floor", "--quiet",
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = read_results(out)
    assert [(r["system"], r["repeat"], r["workload"]) for r in rows] == [
        ("astrai", 0, str(source)),
        ("astrai", 1, str(source)),
    ]
    assert [(r["num_prompts"], r["generated_tokens"]) for r in rows] == [(3, 6), (3, 6)]
    assert not [line for line in result.stderr.splitlines() if line.startswith("bench: ")]
    assert "Loading weights" not in result.stderr


def test_usage_errors_exit_2_with_the_reason(tiny_llama_dir: Path) -> None:
    result = bench("--model", tiny_llama_dir, "--peers", "vllm")
    assert result.exit_code == 2
    assert "peers: unknown peer 'vllm'; known peers: hf-generate, hf-generate-batch" in (
        result.stderr
    )
    result = bench("--tolerance", "lots")
    assert result.exit_code == 2
    assert "tolerance must be like 5% or 0.05, got 'lots'" in result.stderr
    result = bench("--kv-layout", "contiguous,ring")
    assert result.exit_code == 2
    assert "kv layout: unknown layout 'ring'; known layouts: paged, contiguous" in result.stderr
    result = bench("--hf-batch-size", "lots")
    assert result.exit_code == 2
    assert "hf batch size must be auto or a positive int, got 'lots'" in result.stderr
    result = bench("--cuda-graphs")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: --cuda-graphs needs --device cuda, got --device cpu"
    )


def test_a_missing_workload_file_fails_with_exit_1(tiny_llama_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    result = bench("--model", tiny_llama_dir, "--workload", missing, "--quiet")
    assert result.exit_code == 1
    assert (
        f"workload '{missing}' is neither a built-in workload (shared-prefix, unique, "
        "multi-turn, long-prefill) nor an existing input file"
    ) in result.stderr


def test_every_run_is_priced_at_the_highest_gemm_peak_measured(
    full_run: tuple[Result, Path],
) -> None:
    """Measured at the start and after the one repeat: two measurements, the highest used."""
    result, out = full_run
    progress = [line.removeprefix("bench: ") for line in result.stderr.splitlines()]
    line = next(line for line in progress if line.startswith("GEMM peak: "))
    assert line.endswith("); every run's roofline is priced at it"), line
    best, rest = line.removeprefix("GEMM peak: ").split(" GFLOP/s (the highest of ")
    measurements = rest.split(")")[0].split(", ")
    assert len(measurements) == 2
    number = lambda text: float(text.replace(",", ""))  # noqa: E731
    assert number(best) == max(map(number, measurements))
    priced = [r for r in read_results(out) if r["gemm_peak_flops_per_second"] is not None]
    assert len(priced) == 2  # our two layouts; the peers and the floor carry no roofline
    for row in priced:
        assert f"{row['gemm_peak_flops_per_second'] / 1e9:,.0f}" == best
