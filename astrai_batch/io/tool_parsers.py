"""Tool calls read out of a model's text (``tool_choice: auto``), one parser per format:

- ``hermes``: Hermes / Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks; the text before the first block is the content;
- ``llama3_json``: Llama 3's JSON calls ``{"name": ..., "parameters": {...}}`` (optionally
  after ``<|python_tag|>``, several separated by ``;``); the whole text is the calls;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (older
  tokenizers) or ``NAME[ARGS]{...}`` calls (newer ones); the text before it is the content;
- ``harmony``: gpt-oss's ``commentary`` messages addressed ``to=functions.NAME``; the
  ``final`` channel is the content (`harmony`).

A parser gives (content, calls); text it cannot read whole stays content with no calls, as
vLLM does. ``mistral`` and ``harmony`` read the text with special tokens kept
(`NEEDS_SPECIAL_TOKENS`), since their markers are special tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astrai_batch.io.harmony import harmony_messages

TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "harmony")
NEEDS_SPECIAL_TOKENS = frozenset({"mistral", "harmony"})

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_CALL = re.compile(r"([A-Za-z0-9_.:-]+)\[ARGS\]")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's function.arguments


class Unreadable(ValueError):
    """The text is not this parser's calls; it stays content."""


def parse_tool_calls(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of `text` in `parser`'s format; no calls: (text, [])."""
    try:
        content, calls = PARSERS[parser](text)
    except (Unreadable, json.JSONDecodeError):
        return text, []
    if not calls:
        return text, []
    return (content if content and content.strip() else None), calls


def _call(name: Any, arguments: Any) -> ToolCall:
    if not isinstance(name, str) or not name:
        raise Unreadable("a call without a name")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise Unreadable("arguments are not an object")
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise Unreadable("not a JSON object")
    return value


def hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls = []
    for block in _HERMES_BLOCK.findall(text[start:]):
        call = _object(block.strip())
        calls.append(_call(call.get("name"), call.get("arguments")))
    return text[:start].rstrip(), calls


def llama3_json(text: str) -> tuple[str | None, list[ToolCall]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, position = json.JSONDecoder(), [], 0
    while position < len(body):
        value, end = decoder.raw_decode(body, position)
        if not isinstance(value, dict):
            raise Unreadable("not a JSON object")
        arguments = value.get("parameters", value.get("arguments"))
        calls.append(_call(value.get("name"), arguments))
        position = end
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            raise Unreadable("text after the calls")
        position = len(body) - len(rest)
    return None, calls


def mistral(text: str) -> tuple[str | None, list[ToolCall]]:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    body = text[start + len("[TOOL_CALLS]") :].strip()
    for end_marker in ("</s>",):
        body = body.removesuffix(end_marker).strip()
    if body.startswith("["):
        values = json.loads(body)
        if not isinstance(values, list):
            raise Unreadable("not a list of calls")
        calls = [_call(v.get("name"), v.get("arguments")) for v in values if isinstance(v, dict)]
        if len(calls) != len(values):
            raise Unreadable("a call that is not an object")
        return text[:start], calls
    calls, position, decoder = [], 0, json.JSONDecoder()
    while position < len(body):
        match = _MISTRAL_CALL.match(body, position)
        if match is None:
            raise Unreadable("not NAME[ARGS]{...}")
        arguments, end = decoder.raw_decode(body, match.end())
        calls.append(_call(match.group(1), arguments))
        rest = body[end:].lstrip()
        position = len(body) - len(rest.removeprefix("[TOOL_CALLS]").lstrip())
    return text[:start], calls


def harmony(text: str) -> tuple[str | None, list[ToolCall]]:
    messages = harmony_messages(text)
    if not messages:
        return text, []
    calls = []
    for message in messages:
        recipient = message.recipient or ""
        if recipient.startswith("functions."):
            calls.append(_call(recipient.removeprefix("functions."), message.text.strip()))
    content = "".join(m.text for m in messages if m.channel == "final")
    return content, calls


PARSERS: dict[str, Callable[[str], tuple[str | None, list[ToolCall]]]] = {
    "hermes": hermes,
    "llama3_json": llama3_json,
    "mistral": mistral,
    "harmony": harmony,
}
