"""Tool calls in a conversation's history, as transformers' chat templates take them.

An assistant message's ``tool_calls`` keep OpenAI's shape (``id``, ``type``, ``function``
with ``name`` and ``arguments``), except that ``arguments``, JSON text in OpenAI's API, is
given to the template as the object it encodes (templates write it with ``tojson``, as vLLM
passes it); a tool message keeps its ``tool_call_id`` and ``name``.
Row errors: ``messages[1].tool_calls must be a list, got object``,
``messages[1].tool_calls[0].function.name must be a non-empty string``,
``messages[1].tool_calls[0].function.arguments is not valid JSON``,
``messages[2].tool_call_id must be a string, got integer``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.rows import RowProblem
from astrai_batch.json_types import json_type


def tool_calls_of(calls: Any, where: str) -> dict[str, Any]:
    """``{"tool_calls": [...]}`` for an assistant message, normalized for templates."""
    if not isinstance(calls, (list, tuple)):
        raise RowProblem(f"{where}.tool_calls must be a list, got {json_type(calls)}")
    out = []
    for position, call in enumerate(calls):
        at = f"{where}.tool_calls[{position}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise RowProblem(f"{at} must be {{id, type, function: {{name, arguments}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise RowProblem(f"{at}.function.name must be a non-empty string")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise RowProblem(f"{at}.function.arguments is not valid JSON") from None
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if call.get("id") is not None:
            entry["id"] = str(call["id"])
        out.append(entry)
    return {"tool_calls": out}


def tool_reply_fields(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A tool message's ``tool_call_id`` and ``name``, when given."""
    out = {}
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RowProblem(f"{where}.{key} must be a string, got {json_type(value)}")
        out[key] = value
    return out
