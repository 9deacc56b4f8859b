"""`astrai-batch bench --workload scoring` on the tiny model: our scoring requests and the
hf-score-pairs peer in the results file and the table, with prefill counted against the
ideal and the prediction `plan --task score` makes; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner, Result
from transformers import AutoConfig

from astrai_batch.bench.results import RESULTS_COLUMNS
from astrai_batch.bench.score_bench import ScoreWorkload
from astrai_batch.cli import main
from astrai_batch.jobs.planning.task_prefill import ScorePrefillBuilder

# 2 few-shot contexts of 40 tokens x 2 questions x 4 choices: 16 pairs.
SIZES = ("--num-system-prompts", "2", "--questions-per-prompt", "2", "--system-prompt-words", "40")


def bench(*args: Any) -> Result:
    return CliRunner().invoke(main, ["bench", *(str(a) for a in args)], catch_exceptions=False)


@pytest.fixture(scope="module")
def scoring_run(
    tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("bench-scoring") / "results.parquet"
    threads = torch.get_num_threads()
    try:
        result = bench(
            "--model", tiny_llama_dir, "--threads", "1", "--workload", "scoring", *SIZES,
            "--repeat", "2", "--peers", "hf-score-pairs", "--page-size", "8",
            "--kv-cache-memory", "8MiB", "--out", out,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return result, out


def test_scoring_rows_per_system_and_repeat(scoring_run: tuple[Result, Path], tiny_llama_dir):
    result, out = scoring_run
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert tuple(table.schema.names) == RESULTS_COLUMNS
    rows = table.to_pylist()
    assert [(r["system"], r["repeat"]) for r in rows] == [
        ("astrai", 0),
        ("hf-score-pairs", 0),
        ("astrai", 1),
        ("hf-score-pairs", 1),
    ]
    vocab = AutoConfig.from_pretrained(tiny_llama_dir).vocab_size
    work = ScoreWorkload(shots=2, questions=2, shot_tokens=40).rows(vocab)
    prefixes = {
        (*ctx, *cont)[:k]
        for ctx, conts in work
        for cont in conts
        for k in range(1, len(ctx) + len(cont))
    }
    predicted = ScorePrefillBuilder(page_size=8)
    for context, continuations in work:
        predicted.add(context, continuations)
    for row in rows:
        assert row["workload"] == "scoring"
        assert (row["num_prompts"], row["pairs"]) == (4, 16)
        assert row["prompt_tokens"] == sum(len(c) + len(x) - 1 for c, xs in work for x in xs)
        assert row["ideal_prefill_tokens"] == len(prefixes)
        assert row["generated_tokens_per_second"] is None and row["max_tokens"] is None
        assert row["pairs_per_second"] == 16 / row["wall_seconds"]
        engine = row["system"] == "astrai"
        for column in ("prefill_tokens", "prefill_ratio", "cache_hit_rate", "steps"):
            assert (row[column] is not None) == engine, column
        if engine:
            assert row["prefill_tokens"] == predicted.result().predicted_prefill_tokens
            assert row["prefill_ratio"] == row["prefill_tokens"] / len(prefixes)
        else:
            config = json.loads(row["system_config"])
            assert config["batch_size"] == 8 and config["order"] == "by length"
            assert config["max_abs_loglikelihood_difference"] < 1e-4


def test_scoring_table_and_summary(scoring_run: tuple[Result, Path]) -> None:
    result, _ = scoring_run
    assert "astrai-batch bench: scoring, 4 rows, 16 pairs (" in result.stderr
    header = next(line for line in result.stderr.splitlines() if line.startswith("system "))
    assert header.split() == [
        "system",
        "wall",
        "s",
        "pairs/s",
        "pair",
        "tok/s",
        "peak",
        "RSS",
        "astrai",
        "is",
    ]
    assert any(
        line.startswith("hf-score-pairs ") and "x faster" in line
        for line in result.stderr.splitlines()
    )
    assert any(line.startswith("astrai prefill: ") for line in result.stderr.splitlines())
    summary = json.loads(result.stdout)
    assert set(summary["ratios"]) == {"hf-score-pairs"}
    assert summary["ratios"]["hf-score-pairs"]["count"] == 2
    assert set(summary["tracked"]) == {
        "astrai.pairs_per_second",
        "astrai.prefill_ratio",
        "astrai.engine_overhead",
        "ratio.hf-score-pairs",
    }


def test_scoring_results_gate_against_themselves(scoring_run: tuple[Result, Path]) -> None:
    _, out = scoring_run
    again = bench("--from-results", out, "--baseline", out)
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("--workload", "scoring", "--peers", "hf-generate"),
            "peers: hf-generate generates; --workload scoring compares with hf-score-pairs only",
        ),
        (
            ("--workload", "shared-prefix", "--peers", "hf-score-pairs"),
            "peers: hf-score-pairs runs with --workload scoring only",
        ),
        (
            ("--workload", "scoring", "--max-tokens", "4"),
            "--max-tokens does not apply to --workload scoring",
        ),
    ],
)
def test_scoring_usage_errors(args: tuple[str, ...], error: str) -> None:
    result = bench("--model", "unused", *args)
    assert result.exit_code == 2
    assert f"Error: {error}" in result.stderr
