"""`astrai-batch plan`: its numbers against a brute-force count over the same prompts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from jobs.jobkit import SYSTEM_PROMPTS, question, run_cli, write_jsonl
from transformers import AutoTokenizer


def brute_force_reuse(rows: Sequence[Sequence[int]], page: int) -> int:
    """Prompt tokens an infinite page cache serves when rows run in sorted order."""
    cached: set[tuple[int, ...]] = set()
    reused = 0
    for ids in sorted(tuple(row) for row in rows):
        limit = (len(ids) - 1) // page  # the last prompt token is always computed
        hit = 0
        while hit < limit and ids[: (hit + 1) * page] in cached:
            hit += 1
        reused += hit * page
        cached.update(ids[: k * page] for k in range(1, len(ids) // page + 1))
    return reused


def brute_force_shared(rows: Sequence[Sequence[int]], page: int) -> list[tuple[int, int]]:
    """(tokens, rows) of maximal full-page prefixes shared by >= 2 rows, best saving first."""
    prefixes = {tuple(row[: k * page]) for row in rows for k in range(1, len(row) // page + 1)}

    def sharing(prefix: tuple[int, ...]) -> int:
        return sum(1 for row in rows if tuple(row[: len(prefix)]) == prefix)

    found = []
    for prefix in prefixes:
        count = sharing(prefix)
        longer = [
            p for p in prefixes if len(p) == len(prefix) + page and p[: len(prefix)] == prefix
        ]
        if count >= 2 and all(sharing(p) < count for p in longer):
            found.append(((count - 1) * len(prefix), len(prefix), prefix, count))
    found.sort(key=lambda item: (-item[0], -item[1], item[2]))
    return [(tokens, count) for _, tokens, _, count in found]


def test_plan_json_matches_a_brute_force_count(tiny_llama_dir: Path, tmp_path: Path) -> None:
    conversations = [
        [
            {"role": "system", "content": SYSTEM_PROMPTS[i % 3] * (1 + i % 2)},
            {"role": "user", "content": question(i)},
        ]
        for i in range(15)
    ]
    lines: list[object] = [{"messages": c} for c in conversations]
    lines.insert(4, {"messages": []})  # a bad row is counted and left out
    source = write_jsonl(tmp_path / "chat.jsonl", lines)

    result = run_cli("plan", source, "--model", tiny_llama_dir, "--page-size", "8", "--json")

    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    rows = [
        tokenizer(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False))[
            "input_ids"
        ]
        for c in conversations
    ]
    prompt_tokens = sum(len(row) for row in rows)
    reused = brute_force_reuse(rows, 8)
    assert (report["rows"], report["bad_rows"], report["shape"]) == (15, 1, "messages")
    assert report["prompt_tokens"] == prompt_tokens
    assert report["reusable_tokens"] == reused > 0
    assert report["unique_tokens"] == prompt_tokens - reused
    assert report["predicted_prefill_saving"] == reused / prompt_tokens
    top = [(p["num_tokens"], p["num_rows"]) for p in report["top_shared_prefixes"]]
    assert top == brute_force_shared(rows, 8)[:10]
    best = report["top_shared_prefixes"][0]
    assert best["tokens_saved"] == (best["num_rows"] - 1) * best["num_tokens"]
    assert best["preview"] == tokenizer.decode(best["preview_token_ids"])
    assert best["preview"].startswith("<|im_start|>system\n")


def test_plan_text_report(tiny_llama_dir: Path, tmp_path: Path) -> None:
    prompts = [f"{SYSTEM_PROMPTS[0]} {question(i)}" for i in range(4)] + [question(9)]
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in prompts])
    result = run_cli("plan", source, "--model", tiny_llama_dir, "--top", "1")
    assert result.exit_code == 0, result.stderr

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    total = sum(len(row) for row in rows)
    reused = brute_force_reuse(rows, 16)
    ((tokens, count),) = brute_force_shared(rows, 16)[:1]
    lines = result.stdout.splitlines()
    assert lines[:7] == [
        f"input                     {source} (prompt rows)",
        f"model                     {tiny_llama_dir} (tokenizer only)",
        "rows                      5",
        f"prompt tokens             {total:,}",
        f"reusable tokens           {reused:,} (page size 16)",
        f"tokens to prefill         {total - reused:,}",
        f"predicted prefill saving  {reused / total:.1%}",
    ]
    assert lines[7:9] == [
        "largest shared prefixes:",
        "    tokens     rows      saved  preview",
    ]
    assert lines[9].startswith(f'  {tokens:>8,} {count:>8,} {(count - 1) * tokens:>10,}  "You are')
    assert len(lines) == 10


def test_plan_refuses_what_run_would_refuse(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    result = run_cli("plan", missing, "--model", tmp_path)
    assert result.exit_code == 1
    assert result.stderr == f"Error: input not found: {missing}\n"
