"""Rows in the OpenAI Batch API input format: ``{custom_id, method, url, body}``.

What a job does with each body field is `openai_fields`' table (docs/openai.md): the
honoured ones are read here into

- the prompt: ``messages`` (chat; ``image_url`` content parts become the row's images,
  `image_parts`), or ``prompt`` (completions: a string, a list of token ids, or a list
  holding one of those; never images);
- sampling overrides, copied raw into `InputRow.overrides` (``max_completion_tokens`` is the
  newer name of ``max_tokens`` and wins when both are given; a completions ``logprobs``
  integer N asks for logprobs and N alternatives per token);
- ``response_format`` (json_object / json_schema), the row's output constraint
  (`constraint_fields`);
- chat template variables: ``reasoning_effort``, then ``chat_template_kwargs`` over it;
- tools (``tools`` / ``tool_choice``, legacy ``functions`` / ``function_call``:
  `openai_tools`): the template's tools, a forced call's constraint, how output is read;

the ignored ones are returned by name (the job warns once per name), and a refused one makes
the row an error saying why. A null body field is treated as absent, as in every other input
shape. The row id is read like every row's (`row_ids`): ``custom_id`` unless the line also
has an ``id``.

Row error messages, beyond those of `row_validation` (with a ``body.`` prefix) and the
table's: ``custom_id is missing``, ``custom_id must be a string, got integer``,
``method must be POST, got 'GET'``,
``url must be /v1/chat/completions, /v1/completions or /v1/embeddings, got '/v1/x'``,
``body is missing``, ``body must be an object, got string``, ``body is not valid JSON: ...``,
``body has neither messages nor prompt``, ``body.prompt holds 2 prompts; ...``,
``body.logprobs must be an integer from 0 to 5 or a boolean, got 7``,
``body.prompt of /v1/completions is text or token ids; content parts such as images go in
/v1/chat/completions messages``,
``body.echo must be a boolean, got string``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astrai_batch.io.constraint_fields import response_format_override
from astrai_batch.io.openai_fields import check_body_fields
from astrai_batch.io.openai_tools import ToolChoice, parse_tool_choice
from astrai_batch.io.row_validation import (
    collect_overrides,
    messages_content,
    validate_prompt,
    validate_template_kwargs,
    validate_token_ids,
)
from astrai_batch.io.rows import OVERRIDE_FIELDS, TEMPLATE_KWARGS_FIELD, BestOf, RowProblem
from astrai_batch.json_types import json_error_text, json_type

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"

BODY_OVERRIDE_FIELDS = (*OVERRIDE_FIELDS, "max_completion_tokens", "logit_bias")
MAX_COMPLETION_LOGPROBS = 5  # the Completions API's limit on its integer `logprobs`


@dataclass(frozen=True)
class OpenAIRequest:
    """What one chat or completions line asks for (see the module's docstring)."""

    content: dict[str, Any]  # the InputRow keyword: messages, prompt or prompt_token_ids
    overrides: dict[str, Any]
    chat_template_kwargs: dict[str, Any] | None
    ignored_fields: tuple[str, ...]
    tools: ToolChoice | None = None
    echo: str | None = None  # completions' echo: "with_completion" or "prompt" (max_tokens 0)
    best_of: BestOf | None = None


def parse_openai_request(record: Mapping[str, Any]) -> OpenAIRequest:
    """One chat or completions request line; raises RowProblem for the first problem."""
    check_line(record)
    body = _body_object(record.get("body"))
    kind = _request_kind(record.get("url"), body)
    if kind == "chat":
        content = messages_content(body.get("messages"), "body.messages")
    else:
        content = completion_prompt(body.get("prompt"))
    ignored = check_body_fields(body, kind)
    overrides = collect_overrides(body, BODY_OVERRIDE_FIELDS)
    if body.get("response_format") is not None:
        overrides |= response_format_override(body["response_format"], "body.response_format")
    newer_max = overrides.pop("max_completion_tokens", None)
    if newer_max is not None:
        overrides["max_tokens"] = newer_max
    tools = parse_tool_choice(body) if kind == "chat" else None
    tool_constraint = tools.constraint() if tools is not None else None
    if tool_constraint is not None:
        if "constraint" in overrides:
            raise RowProblem(
                "give body.response_format or a tool_choice that forces a call, not both"
            )
        overrides |= tool_constraint
    if kind == "completion" and "logprobs" in overrides:
        overrides |= _completion_logprobs(overrides.pop("logprobs"))
    # echo first: it shows the logprobs the line asked for, not those best_of ranks by
    echo = _echo(body.get("echo"), overrides) if kind == "completion" else None
    best_of = _best_of(body.get("best_of"), overrides) if kind == "completion" else None
    kwargs = validate_template_kwargs(
        body.get(TEMPLATE_KWARGS_FIELD), f"body.{TEMPLATE_KWARGS_FIELD}"
    )
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise RowProblem(f"body.reasoning_effort must be a string, got {json_type(effort)}")
        kwargs = {"reasoning_effort": effort, **(kwargs or {})}
    return OpenAIRequest(content, overrides, kwargs, ignored, tools, echo, best_of)


def check_line(record: Mapping[str, Any]) -> None:
    """The line's own fields (custom_id, method); raises RowProblem."""
    custom_id = record.get("custom_id")
    if custom_id is None:
        raise RowProblem("custom_id is missing")
    if not isinstance(custom_id, str):
        raise RowProblem(f"custom_id must be a string, got {json_type(custom_id)}")
    method = record.get("method")
    if method is not None and method != "POST":
        raise RowProblem(f"method must be POST, got {method!r}")


def completion_prompt(value: Any) -> dict[str, Any]:
    """A completions ``prompt``: a string or token ids, or a list holding one of them."""
    if isinstance(value, list) and any(isinstance(item, Mapping) for item in value):
        raise RowProblem(
            f"body.prompt of {COMPLETIONS_URL} is text or token ids; content parts such as "
            f"images go in {CHAT_URL} messages"
        )
    if isinstance(value, list) and value and all(isinstance(item, (str, list)) for item in value):
        if len(value) != 1:
            raise RowProblem(
                f"body.prompt holds {len(value)} prompts; a line here runs one prompt "
                "(write one line per prompt)"
            )
        value = value[0]
        if isinstance(value, list):
            return {"prompt_token_ids": validate_token_ids(value, "body.prompt[0]")}
        return {"prompt": validate_prompt(value, "body.prompt[0]")}
    if isinstance(value, list):
        return {"prompt_token_ids": validate_token_ids(value, "body.prompt")}
    return {"prompt": validate_prompt(value, "body.prompt")}


def _best_of(value: Any, overrides: dict[str, Any]) -> BestOf | None:
    """Completions' ``best_of``: generate that many samples and return the ``n`` likeliest
    (by the sum of their tokens' logprobs). Equal to ``n``: nothing to choose."""
    if value is None:
        return None
    n = overrides.get("n", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RowProblem(f"body.best_of must be a positive integer, got {_value(value)}")
    if not isinstance(n, bool) and isinstance(n, int) and value < n:
        raise RowProblem(f"body.best_of ({value}) must be at least body.n ({n})")
    if value == n:
        return None
    shown = overrides.get("logprobs") is True
    overrides |= {"n": value, "logprobs": True}
    return BestOf(keep=n, logprobs=shown)


def _value(value: Any) -> str:
    return (
        repr(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else json_type(value)
    )


def _echo(value: Any, overrides: dict[str, Any]) -> str | None:
    """Completions' ``echo``: the prompt and, with logprobs, its tokens' logprobs (vLLM's
    prompt logprobs, N alternatives as asked) before the completion. ``max_tokens: 0``
    scores the prompt alone: one token is generated and left out of the answer."""
    if value is None or value is False:
        return None
    if value is not True:
        raise RowProblem(f"body.echo must be a boolean, got {json_type(value)}")
    if overrides.get("logprobs") is True:
        asked = overrides.get("top_logprobs", 0)
        overrides["prompt_logprobs"] = max(asked, overrides.get("prompt_logprobs") or 0)
    if overrides.get("max_tokens") == 0:
        overrides["max_tokens"] = 1
        overrides.pop("min_tokens", None)
        return "prompt"
    return "with_completion"


def _completion_logprobs(value: Any) -> dict[str, Any]:
    """The Completions API's ``logprobs``: an integer N in 0..5 (the sampled token's logprob
    and its N likeliest alternatives); true/false as chat's boolean."""
    if isinstance(value, bool):
        return {"logprobs": value}
    if not isinstance(value, int) or not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        shown = value if isinstance(value, int) else json_type(value)
        raise RowProblem(
            f"body.logprobs must be an integer from 0 to {MAX_COMPLETION_LOGPROBS} or a "
            f"boolean, got {shown}"
        )
    return {"logprobs": True, "top_logprobs": value} if value else {"logprobs": True}


def body_model(record: Mapping[str, Any]) -> str | None:
    """``body.model`` of a line `parse_openai_request` accepted, when it is a string: jobs
    run the line with the LoRA adapter of that name, if the job has one (vLLM's rule)."""
    model = _body_object(record.get("body")).get("model")
    return model if isinstance(model, str) else None


def request_body(body: Any) -> Mapping[str, Any]:
    """A line's body as an object (JSON text is parsed); raises RowProblem."""
    return _body_object(body)


def _body_object(body: Any) -> Mapping[str, Any]:
    if body is None:
        raise RowProblem("body is missing")
    if isinstance(body, str):
        # Parquet files often store the heterogeneous body as JSON text.
        try:
            body = json.loads(body)
        except json.JSONDecodeError as exc:
            raise RowProblem(f"body is not valid JSON: {json_error_text(exc)}") from None
    if not isinstance(body, Mapping):
        raise RowProblem(f"body must be an object, got {json_type(body)}")
    return body


def _request_kind(url: Any, body: Mapping[str, Any]) -> str:
    """'chat' or 'completion', from the url when given, else from the body's fields."""
    if url is None:
        if body.get("messages") is not None:
            return "chat"
        if body.get("prompt") is not None:
            return "completion"
        raise RowProblem("body has neither messages nor prompt")
    if url == CHAT_URL:
        return "chat"
    if url == COMPLETIONS_URL:
        return "completion"
    raise RowProblem(f"url must be {CHAT_URL}, {COMPLETIONS_URL} or {EMBEDDINGS_URL}, got {url!r}")
