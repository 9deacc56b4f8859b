"""A generated sample read as an OpenAI assistant message: its content, its reasoning
(`--reasoning-parser`) and its tool calls (a forced call's constrained JSON, or
`--tool-call-parser` for ``tool_choice: auto``), as the records hold them.

Tool call ids are derived from the row id, sample and position, so a resumed job writes
the ids an uninterrupted one writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.io import reasoning_parsers, tool_parsers
from astrai_batch.io.tool_parsers import ToolCall


@dataclass(frozen=True)
class ParsedSample:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, str]] | None  # {id, name, arguments}; None: no calls


@dataclass(frozen=True)
class ResponseParsing:
    """The job's parsers, and the tokenizer that re-reads a sample with its special tokens
    for the parsers whose markers are special tokens."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    tokenizer: Any = None

    @property
    def active(self) -> bool:
        return self.tool_parser is not None or self.reasoning_parser is not None

    def parse(
        self,
        text: str,
        token_ids: Sequence[int],
        tool_choice: str | None,
        call_key: str,
    ) -> ParsedSample:
        """`text` (decoded without special tokens) read for a row of `tool_choice`."""
        reasoning, content = None, text
        if self.reasoning_parser is not None:
            source = self._text(self.reasoning_parser, text, token_ids, reasoning_parsers)
            reasoning, content = reasoning_parsers.split_reasoning(self.reasoning_parser, source)
        calls: list[ToolCall] = []
        if tool_choice is not None and content is not None:
            content, calls = self._calls(content, token_ids, tool_choice)
        tool_calls = [
            {"id": call_id(call_key, position), "name": call.name, "arguments": call.arguments}
            for position, call in enumerate(calls)
        ]
        return ParsedSample(content, reasoning, tool_calls or None)

    def _calls(
        self, content: str, token_ids: Sequence[int], tool_choice: str
    ) -> tuple[str | None, list[ToolCall]]:
        if tool_choice.startswith("function:"):
            return forced_call(tool_choice.removeprefix("function:"), content)
        if tool_choice == "required":
            return required_calls(content)
        if self.tool_parser is None:
            return content, []
        # a parser of special-token markers reads the whole sample (harmony's final channel
        # is the content either way)
        source = self._text(self.tool_parser, content, token_ids, tool_parsers)
        parsed, calls = tool_parsers.parse_tool_calls(self.tool_parser, source)
        return (parsed, calls) if calls else (content, [])

    def _text(self, parser: str, text: str, token_ids: Sequence[int], module: Any) -> str:
        if parser not in module.NEEDS_SPECIAL_TOKENS or self.tokenizer is None:
            return text
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)


def forced_call(name: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """A named function's constrained output: its arguments (not JSON: cut off, content)."""
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if not isinstance(arguments, dict):
        return text, []
    return None, [ToolCall(name, json.dumps(arguments, ensure_ascii=False))]


def required_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """``tool_choice: required``'s constrained output: a list of {name, parameters}."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if not isinstance(values, list) or not values:
        return text, []
    calls = []
    for value in values:
        if not isinstance(value, dict):
            return text, []
        name, parameters = value.get("name"), value.get("parameters")
        if not isinstance(name, str) or not isinstance(parameters, dict):
            return text, []
        calls.append(ToolCall(name, json.dumps(parameters, ensure_ascii=False)))
    return None, calls


def call_id(key: str, position: int) -> str:
    digest = hashlib.sha256(f"{key}\0{position}".encode()).hexdigest()[:24]
    return f"call_{digest}"
