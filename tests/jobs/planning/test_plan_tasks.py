"""`astrai-batch plan --task score|embed`: hand-counted prefill on small inputs, the CLI's
numbers against a brute force over lm-eval's `_encode_pair` tokens, and the prediction
against what `run` actually computes on the tiny model."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import run_cli, write_jsonl
from transformers import AutoTokenizer

from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats
from astrai_batch.jobs.planning.task_prefill import (
    EmbedPrefill,
    ScorePrefillBuilder,
    distinct_prefix_tokens,
)

SHOTS = (
    "Q: two plus two? A: four.\nQ: one plus one? A: two.\nQ: five minus two? A: three.\n",
    "Translate: cat -> chat. dog -> chien. house -> maison. tree -> arbre.\n",
)
CHOICES = [" yes", " no way", " maybe later today"]


def score_rows() -> list[dict[str, object]]:
    """Six questions over two few-shot contexts, and one bad row (no continuations)."""
    rows: list[dict[str, object]] = [
        {
            "id": f"r{i}",
            "context": SHOTS[i % 2] + f"Q: item number {i} is? A:",
            "continuations": CHOICES,
        }
        for i in range(6)
    ]
    rows.insert(2, {"id": "bad", "context": "Q:", "continuations": []})
    return rows


def lm_eval_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's HFLM._encode_pair."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    context_enc = tokenizer(context, add_special_tokens=False)["input_ids"]
    return context_enc, whole[len(context_enc) :]


def brute_force_unique(rows: Sequence[Sequence[int]], page: int) -> int:
    """Prompt tokens computed with an unlimited page cache, rows run in sorted order."""
    cached: set[tuple[int, ...]] = set()
    computed = 0
    for ids in sorted(tuple(row) for row in rows):
        limit = (len(ids) - 1) // page
        hit = 0
        while hit < limit and ids[: (hit + 1) * page] in cached:
            hit += 1
        computed += len(ids) - hit * page
        cached.update(ids[: k * page] for k in range(1, len(ids) // page + 1))
    return computed


def brute_force_distinct(sequences: Sequence[Sequence[int]]) -> int:
    return len({tuple(s[:k]) for s in sequences for k in range(1, len(s) + 1)})


def test_score_prefill_hand_counted() -> None:
    # Page 4. Context A (10 tokens): pages [1-4] [5-8], tail 2; context B (9 tokens) shares
    # tokens 1-6 with A but only its first page: pages [1-4] [5 6 30 31], tail 1.
    builder = ScorePrefillBuilder(page_size=4)
    a = tuple(range(1, 11))
    b = (1, 2, 3, 4, 5, 6, 30, 31, 32)
    builder.add(a, [(20,), (21, 22), (23, 24, 25)])
    builder.add(b, [(20, 21)])
    score = builder.result()
    assert score.contexts.prompt_tokens == 19
    assert score.contexts.unique_tokens == 3 * 4 + 2 + 1  # three distinct pages, two tails
    assert score.pairs == 4
    assert score.continuation_tokens == 8
    assert score.branch_tokens == 0 + 1 + 2 + 1
    assert score.predicted_prefill_tokens == 15 + 4
    assert score.pair_alone_tokens == 10 + 11 + 12 + 10
    # A's inputs: its 10 tokens, then 21, then 23 24; B's: 30 31 32 20 past the shared 1-6.
    assert score.ideal_prefill_tokens == 10 + 1 + 2 + 4
    assert score.to_dict() == {
        "pairs": 4,
        "context_tokens": 19,
        "reusable_context_tokens": 4,
        "continuation_tokens": 8,
        "branch_tokens": 4,
        "pair_alone_tokens": 43,
        "predicted_prefill_tokens": 19,
        "ideal_prefill_tokens": 17,
        "predicted_over_ideal": 19 / 17,
        "saving_over_pairs_alone": 1 - 19 / 43,
    }


def test_distinct_prefix_tokens_is_the_prefix_tree_size() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        alphabet = rng.randint(1, 4)
        sequences = [
            [rng.randrange(alphabet) for _ in range(rng.randint(1, 9))]
            for _ in range(rng.randint(1, 8))
        ]
        assert distinct_prefix_tokens(sequences) == brute_force_distinct(sequences), seed


def test_embed_prefill_reuses_only_with_last_pooling() -> None:
    prompts = [tuple(range(1, 10)), (*range(1, 5), 40, 41), tuple(range(1, 10))]
    stats = ideal_prefix_stats(prompts, page_size=4)
    # 24 tokens; computed: the first row's 9, then 2 and 5 (one shared page each, two for
    # the duplicate, whose last token is computed: (9 - 1) // 4 pages reused).
    assert (stats.prompt_tokens, stats.unique_tokens) == (24, 9 + 2 + 1)
    last = EmbedPrefill("last", stats)
    assert (last.uses_prefix_cache, last.predicted_prefill_tokens) == (True, 12)
    assert last.predicted_prefill_saving == 0.5
    for pooling in ("mean", "cls"):
        other = EmbedPrefill(pooling, stats)
        assert other.to_dict() == {
            "pooling": pooling,
            "uses_prefix_cache": False,
            "predicted_prefill_tokens": 24,
            "predicted_prefill_saving": 0.0,
            "last_pooling_prefill_tokens": 12,
        }


def test_plan_score_counts_lm_eval_pairs(tiny_llama_dir: Path, tmp_path: Path) -> None:
    rows = score_rows()
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    result = run_cli(
        "plan", source, "--model", tiny_llama_dir, "--task", "score", "--page-size", "8", "--json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    pairs = [
        lm_eval_pair(tokenizer, row["context"], choice)
        for row in rows
        if row["continuations"]
        for choice in row["continuations"]
    ]
    contexts = [lm_eval_pair(tokenizer, row["context"], "x")[0] for row in rows[:2] + rows[3:]]
    context_unique = brute_force_unique(contexts, 8)
    branches = sum(len(cont) - 1 for _, cont in pairs)
    assert (report["task"], report["rows"], report["bad_rows"]) == ("score", 6, 1)
    assert report["prompt_tokens"] == sum(len(c) for c in contexts)
    assert report["unique_tokens"] == context_unique
    assert report["score"] == {
        "pairs": 18,
        "context_tokens": sum(len(c) for c in contexts),
        "reusable_context_tokens": sum(len(c) for c in contexts) - context_unique,
        "continuation_tokens": sum(len(cont) for _, cont in pairs),
        "branch_tokens": branches,
        "pair_alone_tokens": sum(len(ctx) + len(cont) - 1 for ctx, cont in pairs),
        "predicted_prefill_tokens": context_unique + branches,
        "ideal_prefill_tokens": brute_force_distinct([(ctx + cont)[:-1] for ctx, cont in pairs]),
        "predicted_over_ideal": report["score"]["predicted_over_ideal"],
        "saving_over_pairs_alone": report["score"]["saving_over_pairs_alone"],
    }
    score = report["score"]
    assert (
        score["predicted_over_ideal"]
        == score["predicted_prefill_tokens"] / score["ideal_prefill_tokens"]
    )
    assert score["reusable_context_tokens"] > 0 and score["predicted_over_ideal"] > 1.0

    text = run_cli("plan", source, "--model", tiny_llama_dir, "--task", "score", "--page-size", "8")
    assert text.exit_code == 0, text.stderr
    assert text.stdout.splitlines()[2:11] == [
        "task                      score",
        "rows                      6 (+1 with errors, left out)",
        "pairs                     18 (context, continuation)",
        f"context tokens            {score['context_tokens']:,}",
        f"reusable context tokens   {score['reusable_context_tokens']:,} (page size 8)",
        f"continuation tokens       {score['continuation_tokens']:,} ({branches:,} computed: "
        "each forks from its context, its last token unfed)",
        f"tokens to prefill         {score['predicted_prefill_tokens']:,}",
        f"ideal prefill             {score['ideal_prefill_tokens']:,} (each token of every "
        f"pair's input once): predicted {score['predicted_over_ideal']:.3f}x",
        f"each pair alone           {score['pair_alone_tokens']:,} (one forward per pair): "
        f"predicted saving {score['saving_over_pairs_alone']:.1%}",
    ]


def stats_total(output: Path) -> dict[str, object]:
    stats = pq.read_table(output.with_name(output.stem + ".stats.parquet")).to_pylist()
    return next(row for row in stats if row["is_total"])


def test_plan_score_predicts_what_run_computes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", score_rows())
    planned = run_cli(
        "plan", source, "--model", tiny_llama_dir, "--task", "score", "--page-size", "8", "--json"
    )
    assert planned.exit_code == 0, planned.stderr
    score = json.loads(planned.stdout)["score"]
    output = tmp_path / "out.parquet"
    ran = run_cli(
        "run", source, output, "--model", tiny_llama_dir, "--task", "score", "--page-size", "8",
        "--threads", "1", "--quiet",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.stderr
    total = stats_total(output)
    assert total["prefill_tokens_computed"] == score["predicted_prefill_tokens"]
    assert total["cached_tokens"] == score["reusable_context_tokens"]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_plan_embed_predicts_what_run_computes(
    tiny_llama_dir: Path, tmp_path: Path, pooling: str
) -> None:
    prompts = [SHOTS[i % 2] + f"Item number {i}." for i in range(5)]
    lines: list[object] = [{"id": f"e{i}", "prompt": p} for i, p in enumerate(prompts)]
    lines.append({"id": "bad", "prompt": "x", "max_tokens": 3})  # a row error under embed
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    args = ("--model", tiny_llama_dir, "--task", "embed", "--pooling", pooling, "--page-size", "8")
    planned = run_cli("plan", source, *args, "--json")
    assert planned.exit_code == 0, planned.stderr
    report = json.loads(planned.stdout)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    total = sum(len(row) for row in ids)
    unique = brute_force_unique(ids, 8)
    assert (report["rows"], report["bad_rows"], report["prompt_tokens"]) == (5, 1, total)
    assert report["embed"] == {
        "pooling": pooling,
        "uses_prefix_cache": pooling == "last",
        "predicted_prefill_tokens": unique if pooling == "last" else total,
        "predicted_prefill_saving": (total - unique) / total if pooling == "last" else 0.0,
        "last_pooling_prefill_tokens": unique,
    }
    output = tmp_path / "out.parquet"
    ran = run_cli("run", source, output, *args, "--threads", "1", "--quiet")
    assert ran.exit_code == 0, ran.stderr
    assert (
        stats_total(output)["prefill_tokens_computed"]
        == report["embed"]["predicted_prefill_tokens"]
    )
