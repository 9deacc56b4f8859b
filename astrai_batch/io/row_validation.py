"""Field-level checks shared by every row shape, with the exact row error messages.

Messages (``field`` is ``prompt`` / ``messages`` / ``prompt_token_ids``, or ``body.prompt`` /
``body.messages`` for OpenAI rows):

- ``{field} is missing`` (absent or null), ``{field} is empty``
- ``{field} must be a string, got int``
- ``{field} must be a list of {role, content} objects, got str``, or with ``: item 1 is str``,
  ``: item 1 has no role``, ``: item 1 has no string content``,
  ``: item 1 has a image_url content part; only text is supported``
- ``{field} must be a list of non-negative ints, got str``, or with ``: item 2 is -1``
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from astrai_batch.io.rows import RowPlan, RowProblem, json_text, stringify_id, type_name

MESSAGES_SHAPE_TEXT = "must be a list of {role, content} objects"
TOKEN_IDS_SHAPE_TEXT = "must be a list of non-negative ints"


def row_id_for(record: Mapping[str, Any], index: int, plan: RowPlan) -> str:
    """The id column's value as a string, or the row number when there is none."""
    if plan.id_field is None:
        return str(index)
    value = record.get(plan.id_field)
    return str(index) if value is None else stringify_id(value)


def kept_values(record: Mapping[str, Any], plan: RowPlan) -> dict[str, Any]:
    """The keep columns' values; missing ones are None so every row has every column."""
    if plan.kept_as_json_text:
        return {name: json_text(record.get(name)) for name in plan.keep_columns}
    return {name: record.get(name) for name in plan.keep_columns}


def collect_overrides(record: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Raw override values; null means "use the job default", so it is left out."""
    return {name: record[name] for name in names if record.get(name) is not None}


def validate_content(shape: str, value: Any, field_name: str) -> dict[str, Any]:
    """The InputRow keyword for a prompt / messages / token-id value; raises RowProblem."""
    if shape == "prompt":
        return {"prompt": validate_prompt(value, field_name)}
    if shape == "messages":
        return {"messages": validate_messages(value, field_name)}
    if shape == "prompt_token_ids":
        return {"prompt_token_ids": validate_token_ids(value, field_name)}
    raise ValueError(f"shape must be prompt, messages or prompt_token_ids, got {shape!r}")


def validate_prompt(value: Any, field_name: str) -> str:
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, str):
        raise RowProblem(f"{field_name} must be a string, got {type_name(value)}")
    if value == "":
        raise RowProblem(f"{field_name} is empty")
    return value


def validate_messages(value: Any, field_name: str) -> tuple[dict[str, str], ...]:
    """Messages as {role, content} dicts; other message keys (e.g. `name`) are dropped."""
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, (list, tuple)):
        raise RowProblem(f"{field_name} {MESSAGES_SHAPE_TEXT}, got {type_name(value)}")
    if not value:
        raise RowProblem(f"{field_name} is empty")
    messages = []
    for position, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise RowProblem(
                f"{field_name} {MESSAGES_SHAPE_TEXT}: item {position} is {type_name(message)}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise RowProblem(f"{field_name} {MESSAGES_SHAPE_TEXT}: item {position} has no role")
        content = message_text(message.get("content"), field_name, position)
        messages.append({"role": role, "content": content})
    return tuple(messages)


def message_text(content: Any, field_name: str, position: int) -> str:
    """A message's content as one string.

    OpenAI also allows a list of content parts; text parts are joined with newlines (as vLLM
    does), any other part type is a row error because the model could not see it.
    """
    if isinstance(content, str):
        return content
    prefix = f"{field_name} {MESSAGES_SHAPE_TEXT}: item {position}"
    if not isinstance(content, (list, tuple)) or not content:
        raise RowProblem(f"{prefix} has no string content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping):
            raise RowProblem(f"{prefix} has no string content")
        part_type = part.get("type", "text")
        if part_type != "text":
            raise RowProblem(f"{prefix} has a {part_type} content part; only text is supported")
        text = part.get("text")
        if not isinstance(text, str):
            raise RowProblem(f"{prefix} has no string content")
        texts.append(text)
    return "\n".join(texts)


def validate_token_ids(value: Any, field_name: str) -> tuple[int, ...]:
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, (list, tuple)):
        raise RowProblem(f"{field_name} {TOKEN_IDS_SHAPE_TEXT}, got {type_name(value)}")
    if not value:
        raise RowProblem(f"{field_name} is empty")
    for position, token in enumerate(value):
        # bool is an int subclass, but `true` in a token list is a data bug, not token 1.
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise RowProblem(f"{field_name} {TOKEN_IDS_SHAPE_TEXT}: item {position} is {token!r}")
    return tuple(value)
