"""Benchmark workload generators: determinism, shapes, and their ideal prefix reuse."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from astrai_batch.bench.synthetic_text import third_person
from astrai_batch.bench.workloads import (
    WORKLOAD_NAMES,
    WorkloadRow,
    WorkloadShape,
    WorkloadSpec,
    build_workload,
    write_workload_jsonl,
)
from astrai_batch.errors import ConfigError, OutputError
from astrai_batch.jobs.planning.prefix_order import plan_window
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAGE_SIZE = 16


def encode(tokenizer: PreTrainedTokenizerFast, row: WorkloadRow) -> list[int]:
    """Chat rows through the chat template with the generation prompt, plain rows as text."""
    if row.messages is None:
        return list(tokenizer(row.prompt)["input_ids"])
    encoded = tokenizer.apply_chat_template(
        list(row.messages), add_generation_prompt=True, tokenize=True
    )
    # transformers 5 returns a BatchEncoding here; 4.x returned the list of ids.
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


def simulated_cache_reuse(rows: Sequence[Sequence[int]], page_size: int) -> int:
    """Run rows in sorted order through a brute-force infinite page cache; tokens reused.

    The cache is a flat dict {(parent page id, page tokens): page id}: an independent trie.
    """
    cache: dict[tuple[int, tuple[int, ...]], int] = {}
    reused = 0
    for row in sorted(tuple(row) for row in rows):
        pages = [row[start : start + page_size] for start in range(0, len(row), page_size)]
        full = [page for page in pages if len(page) == page_size]
        parent, hits, still_hitting = -1, 0, True
        for index, page in enumerate(full):
            key = (parent, page)
            if key in cache and still_hitting and index < (len(row) - 1) // page_size:
                hits += 1
            else:
                still_hitting = False
                cache.setdefault(key, len(cache))
            parent = cache[key]
        reused += hits * page_size
    return reused


@pytest.fixture(scope="module")
def workloads() -> dict[str, list[WorkloadRow]]:
    return {name: build_workload(WorkloadSpec(name)) for name in WORKLOAD_NAMES}


def test_presets() -> None:
    assert WorkloadSpec("shared-prefix").shape() == WorkloadShape(8, 32, 215, (8, 30), 64)
    assert WorkloadSpec("unique").shape() == WorkloadShape(8, 32, 215, (8, 30), 64)
    assert WorkloadSpec("multi-turn").shape() == WorkloadShape(8, 8, 215, (8, 30), 64)
    assert WorkloadSpec("long-prefill").shape() == WorkloadShape(4, 1, 1330, (8, 30), 16)
    spec = WorkloadSpec("long-prefill", num_system_prompts=2, max_tokens=5)
    assert spec.shape() == WorkloadShape(2, 1, 1330, (8, 30), 5)


def test_sizes_and_ids(workloads: dict[str, list[WorkloadRow]]) -> None:
    assert {name: len(rows) for name, rows in workloads.items()} == {
        "shared-prefix": 8 * 32,
        "unique": 8 * 32,
        "multi-turn": 8 * 8,
        "long-prefill": 4 * 1,
    }
    for name, rows in workloads.items():
        assert len({row.id for row in rows}) == len(rows)
        assert all(row.id.startswith(f"{name}-") for row in rows)
    small = build_workload(
        WorkloadSpec("shared-prefix", num_system_prompts=3, questions_per_prompt=5)
    )
    assert sorted(row.id for row in small) == [
        f"shared-prefix-{group:04d}-{index:04d}" for group in range(3) for index in range(5)
    ]


def test_deterministic_for_a_seed() -> None:
    for name in WORKLOAD_NAMES:
        assert build_workload(WorkloadSpec(name, seed=7)) == build_workload(
            WorkloadSpec(name, seed=7)
        )
        assert build_workload(WorkloadSpec(name, seed=7)) != build_workload(
            WorkloadSpec(name, seed=8)
        )


def test_small_workload_text_is_pinned() -> None:
    # Pins the generator: the same seed must give the same text on every Python version.
    spec = WorkloadSpec(
        "shared-prefix",
        seed=3,
        num_system_prompts=1,
        questions_per_prompt=1,
        system_prompt_words=20,
        question_words=(8, 8),
    )
    assert build_workload(spec) == [
        WorkloadRow(
            id="shared-prefix-0000-0000",
            messages=(
                {
                    "role": "system",
                    "content": "[#41190] You are a rich teacher for a small player. "
                    "Your friendly area by our key improves every little value simply.",
                },
                {"role": "user", "content": "How does this file report one open bridge?"},
            ),
            prompt=None,
            max_tokens=64,
        )
    ]


def test_shared_prefix_rows_are_shuffled_pairs_of_system_and_question(
    workloads: dict[str, list[WorkloadRow]],
) -> None:
    rows = workloads["shared-prefix"]
    assert all([m["role"] for m in row.messages] == ["system", "user"] for row in rows)
    systems_by_group: dict[str, set[str]] = {}
    for row in rows:
        systems_by_group.setdefault(row.id.split("-")[2], set()).add(row.messages[0]["content"])
    assert len(systems_by_group) == 8
    assert all(len(systems) == 1 for systems in systems_by_group.values())
    assert len(set.union(*systems_by_group.values())) == 8
    for row in rows:
        assert 8 <= len(row.messages[1]["content"].split()) <= 33
        assert 215 <= len(row.messages[0]["content"].split()) <= 215 + 16
    # In file order, neighbours rarely share a system prompt (grouped order would give 248).
    neighbours = sum(a.messages[0] == b.messages[0] for a, b in pairwise(rows))
    assert neighbours < 64


def test_multi_turn_rows_extend_the_previous_turn(
    workloads: dict[str, list[WorkloadRow]], tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    by_id = {row.id: row for row in workloads["multi-turn"]}
    for conversation in range(8):
        turns = [by_id[f"multi-turn-{conversation:04d}-{turn:04d}"] for turn in range(1, 9)]
        assert [len(row.messages) for row in turns] == [2, 4, 6, 8, 10, 12, 14, 16]
        for earlier, later in pairwise(turns):
            assert later.messages[: len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)]["role"] == "assistant"
            earlier_ids, later_ids = encode(tiny_tokenizer, earlier), encode(tiny_tokenizer, later)
            assert later_ids[: len(earlier_ids)] == earlier_ids


def test_long_prefill_rows_are_plain_prompts(workloads: dict[str, list[WorkloadRow]]) -> None:
    rows = workloads["long-prefill"]
    assert all(row.messages is None and row.max_tokens == 16 for row in rows)
    for row in rows:
        document, question = row.prompt.split("\n\nQuestion: ")
        assert 1330 <= len(document.split()) <= 1330 + 17
        assert question.endswith("?\nAnswer:")


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_ideal_reuse_matches_a_simulated_cache(
    name: str, workloads: dict[str, list[WorkloadRow]], tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    rows = workloads[name]
    token_ids = [encode(tiny_tokenizer, row) for row in rows]
    stats = ideal_prefix_stats(token_ids, page_size=PAGE_SIZE)
    stats.check_invariants()
    assert stats.rows == len(rows)
    assert stats.prompt_tokens == sum(len(ids) for ids in token_ids)
    assert stats.reusable_tokens == simulated_cache_reuse(token_ids, PAGE_SIZE)
    if name == "shared-prefix":
        assert stats.predicted_prefill_saving > 0.8
        assert [p.num_rows for p in stats.top_shared_prefixes[:8]] == [32] * 8
        assert plan_window(token_ids, page_size=PAGE_SIZE).num_groups == 8
    elif name == "multi-turn":
        assert stats.predicted_prefill_saving > 0.75
        assert plan_window(token_ids, page_size=PAGE_SIZE).num_groups == 8
    else:
        assert stats.reusable_tokens == 0
        assert plan_window(token_ids, page_size=PAGE_SIZE).num_groups == len(rows)


def test_write_workload_jsonl(tmp_path: Path, workloads: dict[str, list[WorkloadRow]]) -> None:
    rows = workloads["shared-prefix"][:3] + workloads["long-prefill"][:1]
    path = tmp_path / "workload.jsonl"
    write_workload_jsonl(rows, path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert list(first) == ["id", "messages", "max_tokens"]
    assert first == {
        "id": rows[0].id,
        "messages": [dict(message) for message in rows[0].messages],
        "max_tokens": 64,
    }
    assert json.loads(lines[3]) == {"id": rows[3].id, "prompt": rows[3].prompt, "max_tokens": 16}
    with pytest.raises(OutputError, match=r"^cannot write the workload to "):
        write_workload_jsonl(rows, tmp_path)


def test_spec_validation() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^name must be one of shared-prefix, unique, multi-turn, long-prefill; got 'x'$",
    ):
        WorkloadSpec("x")
    with pytest.raises(ConfigError, match=r"^seed must be an integer, got True$"):
        WorkloadSpec("unique", seed=True)
    with pytest.raises(ConfigError, match=r"^num_system_prompts must be >= 1, got 0$"):
        WorkloadSpec("unique", num_system_prompts=0)
    with pytest.raises(ConfigError, match=r"^max_tokens must be an integer, got number$"):
        WorkloadSpec("unique", max_tokens=2.5)
    with pytest.raises(ConfigError, match=r"^question_words must be a pair \(low, high\)"):
        WorkloadSpec("unique", question_words=(9, 3))


def test_spec_from_dict() -> None:
    spec = WorkloadSpec.from_dict({"name": "unique", "seed": 4, "question_words": [2, 5]})
    assert spec == WorkloadSpec("unique", seed=4, question_words=(2, 5))
    with pytest.raises(ConfigError, match=r"^unknown workload keys: rows, size \(known: "):
        WorkloadSpec.from_dict({"name": "unique", "size": 1, "rows": 2})
    with pytest.raises(ConfigError, match=r"^name is required$"):
        WorkloadSpec.from_dict({"seed": 1})


def test_row_validation() -> None:
    with pytest.raises(ConfigError, match=r"^row 'a': exactly one of messages and prompt"):
        WorkloadRow("a", None, None, 4)
    with pytest.raises(ConfigError, match=r"^row 'a': max_tokens must be >= 1, got 0$"):
        WorkloadRow("a", None, "text", 0)


def test_third_person() -> None:
    verbs = ["fix", "carry", "read", "watch", "push", "play", "go"]
    assert [third_person(verb) for verb in verbs] == [
        "fixes", "carries", "reads", "watches", "pushes", "plays", "goes",
    ]  # fmt: skip
