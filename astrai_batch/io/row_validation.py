"""Field-level checks shared by every row shape, with the exact row error messages.

Messages (``field`` is ``prompt`` / ``messages`` / ``prompt_token_ids`` or the
``--prompt-column`` name, or ``body.prompt`` / ``body.messages`` for OpenAI rows), with
JSON type names (string, integer, number, boolean, list, object, null):

- ``{field} is missing`` (absent or null), ``{field} is empty``
- ``{field} must be a string, got integer``
- ``{field} must be a list of {role, content} objects, got string``;
  ``{field}[1] must be a {role, content} object, got string``, ``{field}[1] has no role``,
  ``{field}[1] role must be a string, got integer``, ``{field}[1] has no content``,
  ``{field}[1] content must be a string or a list of content parts, got integer``,
  ``{field}[1] content[0] must be a content part object, got string``,
  ``{field}[1] content[0] has no text``,
  ``{field}[1] has a input_audio content part; only text and image_url are supported``;
  an ``image_url`` part's own messages are `image_parts`'
- ``{field} must be a list of non-negative integers, got string``;
  ``{field}[2] must be a non-negative integer, got -1`` (or ``got boolean``)
- ``chat_template_kwargs must be an object, got list``,
  ``chat_template_kwargs is not valid JSON: ...``
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from astrai_batch.io.image_parts import (
    IMAGE_PART_TYPE,
    IMAGE_PLACEHOLDER,
    check_image_role,
    image_part_ref,
)
from astrai_batch.io.image_sources import ImageRef
from astrai_batch.io.rows import RowPlan, RowProblem, json_text
from astrai_batch.io.tool_history import tool_calls_of, tool_reply_fields
from astrai_batch.json_types import first_non_count, json_object, json_type

MESSAGES_SHAPE_TEXT = "must be a list of {role, content} objects"
TOKEN_IDS_SHAPE_TEXT = "must be a list of non-negative integers"


def kept_values(record: Mapping[str, Any], plan: RowPlan) -> dict[str, Any]:
    """The keep columns' values; missing ones are None so every row has every column."""
    text = plan.json_text_columns
    return {
        name: json_text(record.get(name)) if name in text else record.get(name)
        for name in plan.keep_columns
    }


def collect_overrides(record: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Raw override values; null means "use the job default", so it is left out."""
    return {name: record[name] for name in names if record.get(name) is not None}


def validate_content(
    shape: str, value: Any, field_name: str, *, empty_text: bool = False
) -> dict[str, Any]:
    """The InputRow keyword for a prompt / messages / token-id value; raises RowProblem.
    `empty_text`: an empty string is a value (a --task score context, as lm-eval allows)."""
    if shape == "prompt":
        if empty_text and value == "":
            return {"prompt": ""}
        return {"prompt": validate_prompt(value, field_name)}
    if shape == "messages":
        return messages_content(value, field_name)
    if shape == "prompt_token_ids":
        return {"prompt_token_ids": validate_token_ids(value, field_name)}
    raise ValueError(f"shape must be prompt, messages or prompt_token_ids, got {shape!r}")


def validate_prompt(value: Any, field_name: str) -> str:
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, str):
        raise RowProblem(f"{field_name} must be a string, got {json_type(value)}")
    if value == "":
        raise RowProblem(f"{field_name} is empty")
    return value


def messages_content(value: Any, field_name: str) -> dict[str, Any]:
    """The InputRow keywords of a messages value: ``messages``, and ``images`` (`ImageRef`s
    in the order the messages name them) when it has any."""
    images: list[ImageRef] = []
    messages = validate_messages(value, field_name, images)
    return {"messages": messages, "images": tuple(images)} if images else {"messages": messages}


def validate_messages(
    value: Any, field_name: str, images: list[ImageRef] | None = None
) -> tuple[dict[str, Any], ...]:
    """Messages as {role, content} dicts, with an assistant's ``tool_calls`` and a tool
    message's ``tool_call_id`` / ``name`` kept for the chat template (`tool_history`); other
    message keys are dropped. A content with an ``image_url`` part stays a list of parts
    (each image part ``{"type": "image"}``, its reference appended to `images`); without
    `images`, an image part is a row error."""
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, (list, tuple)):
        raise RowProblem(f"{field_name} {MESSAGES_SHAPE_TEXT}, got {json_type(value)}")
    if not value:
        raise RowProblem(f"{field_name} is empty")
    messages = []
    for position, message in enumerate(value):
        where = f"{field_name}[{position}]"
        if not isinstance(message, Mapping):
            raise RowProblem(
                f"{where} must be a {{role, content}} object, got {json_type(message)}"
            )
        role = message.get("role")
        if role is None or role == "":
            raise RowProblem(f"{where} has no role")
        if not isinstance(role, str):
            raise RowProblem(f"{where} role must be a string, got {json_type(role)}")
        calls = message.get("tool_calls")
        if calls is not None and role == "assistant":
            content = message.get("content")
            text = "" if content in (None, "", []) else message_text(content, where, role)
            messages.append({"role": role, "content": text, **tool_calls_of(calls, where)})
            continue
        entry: dict[str, Any] = {
            "role": role,
            "content": message_text(message.get("content"), where, role, images),
        }
        if role == "tool":
            entry |= tool_reply_fields(message, where)
        messages.append(entry)
    return tuple(messages)


def message_text(
    content: Any, where: str, role: str = "user", images: list[ImageRef] | None = None
) -> str | list[dict[str, Any]]:
    """A message's content: one string, or its parts when it holds images.

    OpenAI also allows a list of content parts; text parts are joined with newlines (as vLLM
    does). ``image_url`` parts (where `images` collects them) keep the list: text parts as
    ``{"type": "text", "text": ...}`` and each image as ``{"type": "image"}``, in order. Any
    other part type is a row error because the model could not see it.
    """
    if isinstance(content, str):
        return content
    if content is None or (isinstance(content, (list, tuple)) and not content):
        raise RowProblem(f"{where} has no content")
    if not isinstance(content, (list, tuple)):
        raise RowProblem(
            f"{where} content must be a string or a list of content parts, got {json_type(content)}"
        )
    parts: list[dict[str, Any]] = []
    found: list[ImageRef] = []
    for number, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise RowProblem(
                f"{where} content[{number}] must be a content part object, got {json_type(part)}"
            )
        part_type = part.get("type") or "text"  # a Parquet struct's absent field is null
        if part_type == IMAGE_PART_TYPE and images is not None:
            check_image_role(role, where)
            found.append(image_part_ref(part, f"{where} content[{number}]"))
            parts.append(dict(IMAGE_PLACEHOLDER))
            continue
        if part_type != "text":
            supported = "text and image_url are" if images is not None else "text is"
            raise RowProblem(f"{where} has a {part_type} content part; only {supported} supported")
        text = part.get("text")
        if not isinstance(text, str):
            raise RowProblem(f"{where} content[{number}] has no text")
        parts.append({"type": "text", "text": text})
    if not found:
        return "\n".join(part["text"] for part in parts)
    assert images is not None
    images.extend(found)
    return parts


def validate_token_ids(value: Any, field_name: str) -> tuple[int, ...]:
    if value is None:
        raise RowProblem(f"{field_name} is missing")
    if not isinstance(value, (list, tuple)):
        raise RowProblem(f"{field_name} {TOKEN_IDS_SHAPE_TEXT}, got {json_type(value)}")
    if not value:
        raise RowProblem(f"{field_name} is empty")
    bad = first_non_count(value)
    if bad is not None:
        raise RowProblem(f"{field_name}[{bad[0]}] must be a non-negative integer, got {bad[1]}")
    return tuple(value)


def validate_template_kwargs(value: Any, field_name: str) -> dict[str, Any] | None:
    """Per-row chat template variables: an object (or, from Parquet, JSON text of one).
    Null values are left out, so a null leaves the job-wide value in place."""
    if value is None:
        return None
    try:
        variables = json_object(value, field_name)
    except ValueError as exc:
        raise RowProblem(str(exc)) from None
    return {str(key): item for key, item in variables.items() if item is not None}


def validate_adapter_name(value: Any, field_name: str) -> str | None:
    """A row's LoRA adapter: a non-empty name, or null for the base model (whether the job
    has an adapter of that name is the job's to say)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        shown = "an empty string" if value == "" else json_type(value)
        raise RowProblem(f"{field_name} must be an adapter name or null, got {shown}")
    return value
