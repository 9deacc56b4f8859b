"""Rows in the OpenAI Batch API input format: ``{custom_id, method, url, body}``.

Only chat and text completions can run here. Body fields are sorted into four groups:

- the prompt: ``messages`` (chat) or ``prompt`` (completions, a string);
- sampling overrides, copied raw into `InputRow.overrides` (``max_completion_tokens`` is the
  newer name of ``max_tokens`` and wins when both are given), and ``chat_template_kwargs``
  (variables for the chat template, as vLLM accepts them);
- fields that change nothing for a local batch run and are ignored (``model``, ``user``, ...);
- ``response_format`` (json_object / json_schema), the row's output constraint
  (`constraint_fields`);
- fields whose meaning this runner cannot honour (``tools``, ``stream: true``, unknown
  fields) which make the row an error naming the field. A few of
  them are accepted at their do-nothing value (``stream: false``, ``tools: []``, ...).

A null body field is treated as absent, as in every other input shape. The row id is read
like every row's (`row_ids`): ``custom_id`` unless the line also has an ``id``.

Row error messages, beyond those of `row_validation` (with a ``body.`` prefix):
``custom_id is missing``, ``custom_id must be a string, got integer``,
``method must be POST, got 'GET'``,
``url must be /v1/chat/completions or /v1/completions, got '/v1/embeddings'``,
``body is missing``, ``body must be an object, got string``, ``body is not valid JSON: ...``,
``body has neither messages nor prompt``, ``unsupported body field 'tools'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.constraint_fields import response_format_override
from astrai_batch.io.row_validation import (
    collect_overrides,
    validate_messages,
    validate_prompt,
    validate_template_kwargs,
)
from astrai_batch.io.rows import OVERRIDE_FIELDS, TEMPLATE_KWARGS_FIELD, RowProblem
from astrai_batch.json_types import json_error_text, json_type

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"

BODY_OVERRIDE_FIELDS = (*OVERRIDE_FIELDS, "max_completion_tokens")

# Defined by OpenAI, but with no effect on what a local batch run generates.
IGNORED_BODY_FIELDS = frozenset(
    {
        "model",
        "user",
        "store",
        "metadata",
        "service_tier",
        "stream_options",
        "parallel_tool_calls",
        "safety_identifier",
        "prompt_cache_key",
    }
)

ACCEPTED_BODY_FIELDS = frozenset(
    {*BODY_OVERRIDE_FIELDS, *IGNORED_BODY_FIELDS, TEMPLATE_KWARGS_FIELD}
)

# Fields accepted only at the value that asks for nothing beyond plain generation, as
# (name, canonical JSON) pairs: JSON text keeps `false` apart from `0` and stays immutable.
NEUTRAL_BODY_VALUES = frozenset(
    {
        ("stream", "false"),
        ("logit_bias", "{}"),
        ("best_of", "1"),
        ("echo", "false"),
        ("suffix", '""'),
        ("tools", "[]"),
        ("functions", "[]"),
        ("tool_choice", '"none"'),
        ("function_call", '"none"'),
        ("modalities", '["text"]'),
    }
)


def parse_openai_request(
    record: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """The prompt keyword, sampling overrides and chat template variables of one request
    line; raises RowProblem for the first problem."""
    custom_id = record.get("custom_id")
    if custom_id is None:
        raise RowProblem("custom_id is missing")
    if not isinstance(custom_id, str):
        raise RowProblem(f"custom_id must be a string, got {json_type(custom_id)}")
    method = record.get("method")
    if method is not None and method != "POST":
        raise RowProblem(f"method must be POST, got {method!r}")
    body = _body_object(record.get("body"))
    kind = _request_kind(record.get("url"), body)
    if kind == "chat":
        content = {"messages": validate_messages(body.get("messages"), "body.messages")}
    else:
        content = {"prompt": validate_prompt(body.get("prompt"), "body.prompt")}
    _reject_unsupported_fields(body, kind)
    overrides = collect_overrides(body, BODY_OVERRIDE_FIELDS)
    if body.get("response_format") is not None:
        overrides |= response_format_override(body["response_format"], "body.response_format")
    newer_max = overrides.pop("max_completion_tokens", None)
    if newer_max is not None:
        overrides["max_tokens"] = newer_max
    kwargs = validate_template_kwargs(
        body.get(TEMPLATE_KWARGS_FIELD), f"body.{TEMPLATE_KWARGS_FIELD}"
    )
    return content, overrides, kwargs


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
    raise RowProblem(f"url must be {CHAT_URL} or {COMPLETIONS_URL}, got {url!r}")


def _reject_unsupported_fields(body: Mapping[str, Any], kind: str) -> None:
    prompt_field = "messages" if kind == "chat" else "prompt"
    for name in sorted(body):
        value = body[name]
        if value is None or name == prompt_field:
            continue
        if name in ACCEPTED_BODY_FIELDS:
            continue
        if name == "response_format":  # read by `response_format_override`
            continue
        if (name, _canonical_json(value)) in NEUTRAL_BODY_VALUES:
            continue
        raise RowProblem(f"unsupported body field {name!r}")


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
