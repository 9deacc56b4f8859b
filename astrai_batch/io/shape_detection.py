"""Which shape each row has, and the checks an input's columns must pass as a whole.

Each row is read by its own fields: without ``--prompt-column``, the first non-null of
``messages``, ``prompt_token_ids``, ``prompt``; else, with a non-null ``body`` that is an
object (or beside a ``custom_id``), an OpenAI batch request line. A row where all of them are
null is read by the first of those fields it has (so it reports ``messages is missing``).
With ``--prompt-column`` that field holds every row's prompt, and its type (string / list of
integers / list of objects) picks the shape. Row ids: see `row_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from astrai_batch.errors import ConfigError, InputError
from astrai_batch.io.image_sources import DEFAULT_MAX_IMAGES_PER_ROW
from astrai_batch.io.rows import ID_FIELDS, PLAIN_SHAPE_FIELDS, RowPlan

NO_SHAPE_MESSAGE = "row has no prompt, messages, prompt_token_ids or body"


def row_shape(
    record: Mapping[str, Any], prompt_column: str | None, column_shape: str | None = None
) -> str | None:
    """The shape of one record, or None when it has no field that gives one."""
    if prompt_column is not None:
        return column_shape or shape_of_value(record.get(prompt_column))
    for name in PLAIN_SHAPE_FIELDS:
        if record.get(name) is not None:
            return name
    body = record.get("body")
    if body is not None and (isinstance(body, Mapping) or "custom_id" in record):
        return "openai"
    for name in PLAIN_SHAPE_FIELDS:
        if name in record:
            return name
    return "openai" if {"custom_id", "body"} <= record.keys() else None


def shape_of_value(value: Any) -> str:
    """The shape of a --prompt-column value: lists of objects are chats, other lists token
    ids, anything else a prompt (so a wrong type is reported against ``must be a string``)."""
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], Mapping):
            return "messages"
        return "prompt_token_ids"
    return "prompt"


def shapes_of_columns(columns: Collection[str]) -> list[str]:
    """The shapes rows of an input with these columns can have, in priority order."""
    shapes = [name for name in PLAIN_SHAPE_FIELDS if name in columns]
    if {"custom_id", "body"} <= set(columns):
        shapes.append("openai")
    return shapes


def source_shape(shapes: Collection[str]) -> str:
    """What an input holds as a whole: its one row shape, or 'mixed'."""
    return next(iter(shapes)) if len(shapes) == 1 else "mixed"


def plan_for_columns(
    columns: Sequence[str],
    source_name: str,
    *,
    prompt_column: str | None,
    prompt_column_shape: Callable[[str], str | None],
    usable: bool,
    id_column: str | None,
    keep_columns: Sequence[str],
    json_text_columns: Sequence[str] = (),
    task: str = "generate",
    image_column: str | None = None,
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW,
) -> RowPlan:
    """The reading plan for an input with these columns; InputError when none is usable.

    `usable` tells whether any row can have a shape (some shape column exists);
    `prompt_column_shape` gives the fixed shape of an explicitly named prompt column, or None
    where each value decides; it is only called for a column that exists.
    """
    listing = ", ".join(columns) if columns else "(none)"
    column_shape = None
    if prompt_column is not None:
        _require_column(prompt_column, "prompt column", columns, source_name, listing)
        column_shape = prompt_column_shape(prompt_column)
    elif not usable:
        raise no_prompt_column(source_name, columns)
    if id_column is not None:
        _require_column(id_column, "id column", columns, source_name, listing)
    if image_column is not None:
        _require_column(image_column, "image column", columns, source_name, listing)
        if image_column == prompt_column:
            raise ConfigError(f"--image-column and --prompt-column both name {image_column!r}")
    keep = tuple(keep_columns)
    duplicates = sorted({name for name in keep if keep.count(name) > 1})
    if duplicates:
        raise ConfigError(f"keep_columns lists {', '.join(duplicates)} more than once")
    for name in keep:
        _require_column(name, "keep column", columns, source_name, listing)
    id_fields = (id_column,) if id_column is not None else ID_FIELDS
    return RowPlan(
        prompt_column=prompt_column,
        prompt_column_shape=column_shape,
        id_column=id_column,
        has_ids=any(name in columns for name in id_fields),
        keep_columns=keep,
        json_text_columns=tuple(json_text_columns),
        task=task,
        image_column=image_column,
        max_images_per_row=max_images_per_row,
    )


def no_prompt_column(source_name: str, columns: Sequence[str]) -> InputError:
    listing = ", ".join(columns) if columns else "(none)"
    return InputError(
        f"no prompt column found in {source_name}: expected one of prompt, messages, "
        f"prompt_token_ids, custom_id+body (or pass --prompt-column); columns are: {listing}"
    )


def _require_column(
    name: str, role: str, columns: Sequence[str], source_name: str, listing: str
) -> None:
    if name not in columns:
        raise InputError(f"{role} {name!r} not found in {source_name}; columns are: {listing}")
