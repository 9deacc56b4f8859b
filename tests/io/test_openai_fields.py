"""The field table of OpenAI request bodies (`io.openai_fields`, docs/openai.md), walked one
line per field: honoured fields change the row, ignored ones are named for the job's one
warning, refused ones are row errors saying why (their neutral values pass)."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params

from astrai_batch.io import InputRow, open_input
from astrai_batch.io.openai_fields import TABLES, URLS, ignored_field_warning

HELLO = [{"role": "user", "content": "Hello"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# A value of each field that asks for something (never a neutral value).
SHARED = {
    "model": "m",
    "max_tokens": 5,
    "n": 2,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 1,
    "stop": ["\n"],
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "logit_bias": {"5": 10},
    "user": "u-1",
    "stream": True,
    "stream_options": {"include_usage": True},
    "top_k": 5,
    "min_p": 0.1,
    "min_tokens": 1,
    "repetition_penalty": 1.1,
    "stop_token_ids": [2],
    "ignore_eos": True,
    "prompt_logprobs": 1,
}
EXAMPLES: dict[str, dict[str, Any]] = {
    "chat": {
        **SHARED,
        "messages": HELLO,
        "max_completion_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": [TOOL],
        "tool_choice": "required",
        "functions": [TOOL["function"]],
        "function_call": {"name": "f"},
        "parallel_tool_calls": True,
        "audio": {"voice": "alloy", "format": "wav"},
        "modalities": ["text", "audio"],
        "web_search_options": {},
        "prediction": {"type": "content", "content": "Hi"},
        "verbosity": "low",
        "store": True,
        "metadata": {"k": "v"},
        "service_tier": "flex",
        "safety_identifier": "s-1",
        "prompt_cache_key": "k-1",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "auto"},
        "moderation": {"mode": "auto"},
    },
    "completion": {
        **SHARED,
        "prompt": "Once upon",
        "logprobs": 2,
        "echo": True,
        "best_of": 3,
        "suffix": "the end",
    },
    "embedding": {
        "input": "Hello",
        "model": "m",
        "dimensions": 8,
        "encoding_format": "base64",
        "user": "u-1",
    },
}
# Fields that mean something only beside another: the line without them has that one too.
COMPANIONS = {"tool_choice": {"tools": [TOOL]}, "function_call": {"functions": [TOOL["function"]]}}
CONTENT_FIELD = {"chat": "messages", "completion": "prompt", "embedding": "input"}
MINIMAL = {kind: {name: EXAMPLES[kind][name]} for kind, name in CONTENT_FIELD.items()}


def openai_fields(params: type) -> set[str]:
    return set(typing.get_type_hints(params))


def test_the_table_names_every_field_of_openais_request_types() -> None:
    # the `openai` package's own request types are the reference; `stream` lives in their
    # streaming / non-streaming variants
    chat = openai_fields(chat_create_params.CompletionCreateParamsNonStreaming)
    completion = openai_fields(completion_create_params.CompletionCreateParamsNonStreaming)
    embedding = openai_fields(embedding_create_params.EmbeddingCreateParams)
    assert chat - set(TABLES["chat"]) == set()
    assert completion - set(TABLES["completion"]) == set()
    assert embedding - set(TABLES["embedding"]) == set()
    for kind in TABLES:
        assert set(EXAMPLES[kind]) == set(TABLES[kind]), kind


def read_row(tmp_path: Path, kind: str, body: dict[str, Any]) -> InputRow:
    line = {"custom_id": "r", "method": "POST", "url": URLS[kind], "body": body}
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(line) + "\n")
    task = "embed" if kind == "embedding" else "generate"
    [row] = open_input(path, task=task).iter_rows()
    return row


def field_cases() -> list[tuple[str, str]]:
    return [(kind, name) for kind, table in TABLES.items() for name in sorted(table)]


@pytest.mark.parametrize(("kind", "name"), field_cases())
def test_each_field_has_the_outcome_the_table_names(tmp_path: Path, kind: str, name: str) -> None:
    rule = TABLES[kind][name]
    base = {**MINIMAL[kind], **COMPANIONS.get(name, {})}
    without = read_row(tmp_path, kind, base)
    assert without.error is None and without.ignored_fields == ()
    row = read_row(tmp_path, kind, {**base, name: EXAMPLES[kind][name]})
    if rule.outcome == "refused":
        assert row.error == f"body.{name} cannot be honoured: {rule.note}"
        for neutral in rule.neutral:
            value = json.loads(neutral)
            assert read_row(tmp_path, kind, {**base, name: value}) == without
        return
    assert row.error is None
    if rule.outcome == "ignored":
        assert row.ignored_fields == (name,)
        assert row == dataclasses.replace(without, ignored_fields=(name,))
        assert (
            ignored_field_warning(name) == f"warning: body field {name!r} is ignored: {rule.note}"
        )
    elif name != CONTENT_FIELD[kind]:
        assert row.ignored_fields == ()
        assert row != without  # the field reached the row: an override, a variable, a model


@pytest.mark.parametrize("kind", list(TABLES))
def test_a_field_of_no_table_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    row = read_row(tmp_path, kind, {**MINIMAL[kind], "made_up_option": 1})
    assert row.error == f"body field 'made_up_option' is not a field of {URLS[kind]} requests"


def test_stream_true_is_refused_for_what_it_asks_and_false_passes(tmp_path: Path) -> None:
    refused = read_row(tmp_path, "chat", {"messages": HELLO, "stream": True})
    assert refused.error == (
        "body.stream cannot be honoured: a batch job writes each response whole, never as a "
        "stream (give false or leave it out)"
    )
    assert read_row(tmp_path, "chat", {"messages": HELLO, "stream": 0}).error == refused.error
    assert read_row(tmp_path, "chat", {"messages": HELLO, "stream": False}).error is None


def test_ignored_fields_are_named_in_order_and_nulls_are_absent(tmp_path: Path) -> None:
    body = {"messages": HELLO, "verbosity": "low", "store": True, "metadata": None}
    assert read_row(tmp_path, "chat", body).ignored_fields == ("store", "verbosity")


API_TITLES = {
    "chat": "Chat completions (`/v1/chat/completions`)",
    "completion": "Completions (`/v1/completions`)",
    "embedding": "Embeddings (`/v1/embeddings`)",
}


def table_markdown(kind: str) -> str:
    lines = [
        f"### {API_TITLES[kind]}",
        "",
        "| field | outcome | what the job does |",
        "|---|---|---|",
    ]
    for name, rule in sorted(TABLES[kind].items()):
        note = rule.note
        if rule.neutral:
            note += " (accepted at " + ", ".join(f"`{v}`" for v in sorted(rule.neutral)) + ")"
        lines.append(f"| `{name}` | {rule.outcome} | {note} |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind", list(TABLES))
def test_docs_hold_the_table_as_the_code_has_it(kind: str) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "openai.md").read_text()
    assert table_markdown(kind) in docs
