"""Rows in the OpenAI Batch API input format: ``{custom_id, method, url, body}``.

Only chat and text completions can run here. Body fields are sorted into four groups:

- the prompt: ``messages`` (chat) or ``prompt`` (completions, a string);
- sampling overrides, copied raw into `InputRow.overrides` (``max_completion_tokens`` is the
  newer name of ``max_tokens`` and wins when both are given);
- fields that change nothing for a local batch run and are ignored (``model``, ``user``, ...);
- ``response_format`` (json_object / json_schema), the row's output constraint
  (`constraint_fields`);
- fields whose meaning this runner cannot honour (``tools``, ``stream: true``, unknown
  fields) which make the row an error naming the field. A few of
  them are accepted at their do-nothing value (``stream: false``, ``tools: []``, ...).

A null body field is treated as absent, as in every other input shape.

Row error messages, beyond those of `row_validation` (with a ``body.`` prefix):
``custom_id is missing``, ``custom_id must be a string, got int``,
``method must be POST, got 'GET'``,
``url must be /v1/chat/completions or /v1/completions, got '/v1/embeddings'``,
``body is missing``, ``body must be an object, got str``, ``body is not valid JSON: ...``,
``body has neither messages nor prompt``, ``unsupported body field 'tools'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.constraint_fields import parse_json_text, response_format_override
from astrai_batch.io.row_validation import (
    collect_overrides,
    row_id_for,
    validate_messages,
    validate_prompt,
)
from astrai_batch.io.rows import OVERRIDE_FIELDS, InputRow, RowPlan, RowProblem, type_name

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

# Fields accepted only at the value that asks for nothing beyond plain generation, as
# (name, canonical JSON) pairs: JSON text keeps `false` apart from `0` and stays immutable.
NEUTRAL_BODY_VALUES = frozenset(
    {
        ("stream", "false"),
        ("logit_bias", "{}"),
        ("top_logprobs", "0"),
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


def parse_openai_record(
    record: Mapping[str, Any], index: int, plan: RowPlan, kept: dict[str, Any]
) -> InputRow:
    """The row for one OpenAI batch request line; every problem becomes `InputRow.error`."""
    custom_id = record.get("custom_id")
    row_id = row_id_for(record, index, plan)
    recorded_custom_id = custom_id if isinstance(custom_id, str) else None
    try:
        content, overrides = _parse_request(record)
    except RowProblem as problem:
        return InputRow(
            index=index, id=row_id, kept=kept, error=str(problem), custom_id=recorded_custom_id
        )
    return InputRow(
        index=index,
        id=row_id,
        overrides=overrides,
        kept=kept,
        custom_id=recorded_custom_id,
        **content,
    )


def _parse_request(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    custom_id = record.get("custom_id")
    if custom_id is None:
        raise RowProblem("custom_id is missing")
    if not isinstance(custom_id, str):
        raise RowProblem(f"custom_id must be a string, got {type_name(custom_id)}")
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
    return content, overrides


def _body_object(body: Any) -> Mapping[str, Any]:
    if body is None:
        raise RowProblem("body is missing")
    # Parquet files often store the heterogeneous body as JSON text.
    body = parse_json_text(body, "body")
    if not isinstance(body, Mapping):
        raise RowProblem(f"body must be an object, got {type_name(body)}")
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
        if name in BODY_OVERRIDE_FIELDS or name in IGNORED_BODY_FIELDS:
            continue
        if name == "response_format":  # read by `response_format_override`
            continue
        if (name, _canonical_json(value)) in NEUTRAL_BODY_VALUES:
            continue
        raise RowProblem(f"unsupported body field {name!r}")


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
