"""OpenAI Batch API request lines as input."""

from __future__ import annotations

from typing import Any

import pytest

from astrai_batch.io import InputRow, open_input
from astrai_batch.io.rows import BestOf

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]


def request(custom_id: Any = "r", url: Any = CHAT, **body: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": url}
    line["body"] = body if body else {"model": "gpt-4o-mini", "messages": HELLO}
    return line


def only_row(write_jsonl, line: dict[str, Any] | str) -> InputRow:
    # The first line fixes the shape; the line under test comes second.
    source = open_input(write_jsonl("batch.jsonl", [request("first"), line]))
    assert source.shape == "openai"
    return list(source.iter_rows())[1]


def test_chat_and_completion_requests(write_jsonl) -> None:
    lines = [
        request("chat-1", CHAT, model="m", messages=HELLO, temperature=0.2, user="u-1"),
        request("text-1", COMPLETIONS, model="m", prompt="Once upon", max_tokens=9),
        {"custom_id": "bare", "body": {"prompt": "No url"}},
    ]
    source = open_input(write_jsonl("batch.jsonl", lines))
    assert source.shape == "openai"
    rows = list(source.iter_rows())
    assert rows == [
        InputRow(
            index=0,
            id="chat-1",
            messages=({"role": "user", "content": "Hello"},),
            overrides={"temperature": 0.2},
            custom_id="chat-1",
            model="m",  # body.model: a job runs the line with the adapter of that name
            ignored_fields=("user",),  # the job warns once that it ignores body.user
        ),
        InputRow(
            index=1,
            id="text-1",
            prompt="Once upon",
            overrides={"max_tokens": 9},
            custom_id="text-1",
            model="m",
        ),
        InputRow(index=2, id="bare", prompt="No url", custom_id="bare"),
    ]
    assert [row.kind for row in rows] == ["chat", "completion", "completion"]


def test_every_body_sampling_field_becomes_an_override(write_jsonl) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 5,
        "temperature": 0.7,
        "top_p": 0.8,
        "seed": 42,
        "stop": ["\n"],
        "n": 2,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "logprobs": True,
        "top_k": 20,
        "min_p": 0.1,
        "min_tokens": 1,
        "repetition_penalty": 1.1,
        "temperature_unused": None,
    }
    row = only_row(write_jsonl, request("x", **body))
    assert row.error is None
    assert row.overrides == {
        "max_tokens": 5,
        "temperature": 0.7,
        "top_p": 0.8,
        "seed": 42,
        "stop": ["\n"],
        "n": 2,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "logprobs": True,
        "top_k": 20,
        "min_p": 0.1,
        "min_tokens": 1,
        "repetition_penalty": 1.1,
    }


def test_max_completion_tokens_is_max_tokens_and_wins(write_jsonl) -> None:
    row = only_row(write_jsonl, request(messages=HELLO, max_completion_tokens=7))
    assert row.overrides == {"max_tokens": 7}
    row = only_row(write_jsonl, request(messages=HELLO, max_tokens=3, max_completion_tokens=7))
    assert row.overrides == {"max_tokens": 7}


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "gpt-4o", "user": "me", "store": True, "metadata": {"k": "v"}},
        {"stream": False, "stream_options": {"include_usage": True}},
        {"tools": [], "tool_choice": "none", "parallel_tool_calls": False},
        {"response_format": {"type": "text"}, "logit_bias": {}, "top_logprobs": 0},
        {"modalities": ["text"], "service_tier": "auto"},
        {"tools": None, "response_format": None, "stream": None},
    ],
)
def test_fields_that_change_nothing_are_accepted(write_jsonl, fields: dict[str, Any]) -> None:
    row = only_row(write_jsonl, request(messages=HELLO, **fields))
    assert row.error is None
    assert row.messages == ({"role": "user", "content": "Hello"},)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"response_format": {"type": "xml"}},
            "body.response_format.type must be text, json_object or json_schema, got 'xml'",
        ),
        (
            {"audio": {"voice": "x"}},
            "body.audio cannot be honoured: the runner generates text only, never audio",
        ),
        (
            {"made_up_option": 1},
            "body field 'made_up_option' is not a field of /v1/chat/completions requests",
        ),
        (
            {"prompt": "also a prompt"},
            "body field 'prompt' is not a field of /v1/chat/completions requests",
        ),
        ({"reasoning_effort": 3}, "body.reasoning_effort must be a string, got integer"),
    ],
)
def test_fields_that_change_meaning_are_row_errors(
    write_jsonl, fields: dict[str, Any], message: str
) -> None:
    row = only_row(write_jsonl, request("bad", messages=HELLO, **fields))
    assert row == InputRow(index=1, id="bad", error=message, custom_id="bad")


def test_completion_only_fields_are_rejected_unless_neutral(write_jsonl) -> None:
    neutral = request(url=COMPLETIONS, prompt="p", echo=False, best_of=1, suffix="")
    assert only_row(write_jsonl, neutral).error is None
    suffix = request(url=COMPLETIONS, prompt="p", suffix="end")
    assert only_row(write_jsonl, suffix).error == (
        "body.suffix cannot be honoured: inserting between a prompt and a suffix needs a "
        "fill-in-the-middle model"
    )


@pytest.mark.parametrize(
    ("fields", "echo", "overrides"),
    [
        ({}, "with_completion", {}),
        (
            {"logprobs": 2},
            "with_completion",
            {"logprobs": True, "top_logprobs": 2, "prompt_logprobs": 2},
        ),
        (
            {"logprobs": 1, "max_tokens": 0},
            "prompt",
            {"logprobs": True, "top_logprobs": 1, "prompt_logprobs": 1, "max_tokens": 1},
        ),
        (
            {"logprobs": 0, "max_tokens": 0},
            "prompt",
            {"logprobs": True, "prompt_logprobs": 0, "max_tokens": 1},
        ),
    ],
)
def test_echo_asks_for_the_prompt_and_its_logprobs(
    write_jsonl, fields: dict[str, Any], echo: str, overrides: dict[str, Any]
) -> None:
    row = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", echo=True, **fields))
    assert (row.echo, row.overrides) == (echo, overrides)
    bad = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", echo="yes"))
    assert bad.error == "body.echo must be a boolean, got string"


def test_reasoning_effort_is_a_template_variable_under_chat_template_kwargs(write_jsonl) -> None:
    row = only_row(write_jsonl, request(messages=HELLO, reasoning_effort="high"))
    assert row.chat_template_kwargs == {"reasoning_effort": "high"}
    both = request(
        messages=HELLO, reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"}
    )
    assert only_row(write_jsonl, both).chat_template_kwargs == {"reasoning_effort": "low"}


@pytest.mark.parametrize(
    ("prompt", "content"),
    [
        ("Once", {"prompt": "Once"}),
        (["Once"], {"prompt": "Once"}),
        ([5, 6, 7], {"prompt_token_ids": (5, 6, 7)}),
        ([[5, 6]], {"prompt_token_ids": (5, 6)}),
        (["One", "Two", "Three"], {"prompt": "One", "extra_prompts": ("Two", "Three")}),
        ([[5, 6], [7]], {"prompt_token_ids": (5, 6), "extra_prompts": ((7,),)}),
    ],
)
def test_completion_prompt_shapes(write_jsonl, prompt: Any, content: dict[str, Any]) -> None:
    row = only_row(write_jsonl, request("p", url=COMPLETIONS, prompt=prompt))
    assert row == InputRow(index=1, id="p", custom_id="p", **content)


@pytest.mark.parametrize(
    ("logprobs", "overrides"),
    [
        (0, {"logprobs": True}),
        (3, {"logprobs": True, "top_logprobs": 3}),
        (True, {"logprobs": True}),
        (False, {"logprobs": False}),
    ],
)
def test_completion_logprobs_integer(write_jsonl, logprobs: Any, overrides: dict) -> None:
    row = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", logprobs=logprobs))
    assert row.overrides == overrides


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"body": {"messages": HELLO}}, "custom_id is missing"),
        (request(custom_id=None), "custom_id is missing"),
        (request(custom_id=12), "custom_id must be a string, got integer"),
        ({**request(), "method": "GET"}, "method must be POST, got 'GET'"),
        (
            request(url="/v1/responses", input="x"),
            "url must be /v1/chat/completions, /v1/completions or /v1/embeddings, "
            "got '/v1/responses'",
        ),
        (
            request(url=COMPLETIONS, prompt=["a", [1, 2]]),
            "body.prompt must be a string, a list of token ids, a list of strings or a list of "
            "token-id lists, got a list mixing them",
        ),
        (request(url=COMPLETIONS, prompt=["a", ""]), "body.prompt[1] is empty"),
        (
            request(url=COMPLETIONS, prompt=[[1], [2, -1]]),
            "body.prompt[1][1] must be a non-negative integer, got -1",
        ),
        (
            request(url=COMPLETIONS, prompt=["a", "b"], prompt_logprobs=1),
            "body.prompt_logprobs needs one prompt per line; with several prompts give echo "
            "with logprobs (each choice then holds its prompt's logprobs)",
        ),
        (
            request(url=COMPLETIONS, prompt="p", logprobs=6),
            "body.logprobs must be an integer from 0 to 5 or a boolean, got 6",
        ),
        (
            request(url=COMPLETIONS, prompt=[[1, -2]]),
            "body.prompt[0][1] must be a non-negative integer, got -2",
        ),
        ({"custom_id": "r", "body": None}, "body is missing"),
        ({"custom_id": "r", "body": ["x"]}, "body must be an object, got list"),
        (
            {"custom_id": "r", "body": "{nope"},
            "body is not valid JSON: Expecting property name enclosed in double quotes at column 2",
        ),
        ({"custom_id": "r", "body": {"model": "m"}}, "body has neither messages nor prompt"),
        (request(url=CHAT, prompt="p"), "body.messages is missing"),
        (request(url=CHAT, messages=[]), "body.messages is empty"),
        (
            request(url=CHAT, messages=[{"role": "user"}]),
            "body.messages[0] has no content",
        ),
        (request(url=COMPLETIONS, messages=HELLO), "body.prompt is missing"),
        (request(url=COMPLETIONS, prompt=""), "body.prompt is empty"),
        (request(url=COMPLETIONS, prompt={"a": 1}), "body.prompt must be a string, got object"),
    ],
)
def test_bad_request_messages(write_jsonl, line: dict[str, Any], message: str) -> None:
    row = only_row(write_jsonl, line)
    assert row.error == message
    assert row.overrides == {}
    custom_id = line.get("custom_id")
    assert row.custom_id == (custom_id if isinstance(custom_id, str) else None)
    # The input has ids (custom_id), so a line without one has none, never its row number.
    assert row.id == (None if custom_id is None else str(custom_id))


def test_id_column_overrides_custom_id_but_custom_id_is_kept(write_jsonl) -> None:
    line = {**request("cid"), "row_key": "k-1"}
    path = write_jsonl("batch.jsonl", [line])
    [row] = open_input(path, id_column="row_key").iter_rows()
    assert (row.id, row.custom_id) == ("k-1", "cid")


def test_an_embeddings_line_is_an_embedding_row_in_any_job(write_jsonl) -> None:
    line = request("e", url="/v1/embeddings", input="x", encoding_format="base64", dimensions=4)
    row = only_row(write_jsonl, line)
    assert (row.error, row.prompt, row.embedding, row.overrides) == (
        None,
        "x",
        "base64",
        {"dimensions": 4},
    )


def test_best_of_generates_more_and_keeps_n(write_jsonl) -> None:
    row = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", best_of=3, n=2))
    assert row.overrides == {"n": 3, "logprobs": True}
    assert row.best_of == BestOf(keep=2, logprobs=False)
    shown = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", best_of=2, logprobs=1))
    assert shown.best_of == BestOf(keep=1, logprobs=True)
    same = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", best_of=2, n=2))
    assert (same.best_of, same.overrides) == (None, {"n": 2})
    fewer = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", best_of=1, n=2))
    assert fewer.error == "body.best_of (1) must be at least body.n (2)"
    bad = only_row(write_jsonl, request(url=COMPLETIONS, prompt="p", best_of="3"))
    assert bad.error == "body.best_of must be a positive integer, got string"
