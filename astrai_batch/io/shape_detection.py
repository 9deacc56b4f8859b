"""Decide, once per input, which row shape it has and which columns feed which field.

Priority without ``--prompt-column``: OpenAI batch lines (``custom_id`` + ``body``), then
``messages``, ``prompt_token_ids``, ``prompt``. With ``--prompt-column`` that column is used
whatever else exists, and its values' type (string / list of ints / list of objects) picks
the shape. The id comes from ``--id-column``, else ``id``, else ``custom_id``, else the row
number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from astrai_batch.errors import ConfigError, InputError
from astrai_batch.io.rows import RowPlan

PLAIN_SHAPES_BY_PRIORITY = ("messages", "prompt_token_ids", "prompt")


def detect_shape(columns: Sequence[str]) -> str | None:
    """The row shape implied by column names alone, or None when none fits."""
    present = set(columns)
    if {"custom_id", "body"} <= present:
        return "openai"
    for shape in PLAIN_SHAPES_BY_PRIORITY:
        if shape in present:
            return shape
    return None


def plan_for_columns(
    columns: Sequence[str],
    source_name: str,
    *,
    prompt_column: str | None,
    shape_of_column: Callable[[str], str],
    id_column: str | None,
    keep_columns: Sequence[str],
    kept_as_json_text: bool,
) -> RowPlan:
    """The reading plan for an input with these columns; InputError when none is usable.

    `shape_of_column` tells the shape of an explicitly named prompt column from its values'
    type; it is only called for a column that exists.
    """
    listing = ", ".join(columns) if columns else "(none)"
    if prompt_column is not None:
        _require_column(prompt_column, "prompt column", columns, source_name, listing)
        shape, prompt_field = shape_of_column(prompt_column), prompt_column
    else:
        detected = detect_shape(columns)
        if detected is None:
            raise InputError(
                f"no prompt column found in {source_name}: expected one of prompt, messages, "
                "prompt_token_ids, custom_id+body (or pass --prompt-column); "
                f"columns are: {listing}"
            )
        shape, prompt_field = detected, "body" if detected == "openai" else detected
    if id_column is not None:
        _require_column(id_column, "id column", columns, source_name, listing)
    keep = tuple(keep_columns)
    duplicates = sorted({name for name in keep if keep.count(name) > 1})
    if duplicates:
        raise ConfigError(f"keep_columns lists {', '.join(duplicates)} more than once")
    for name in keep:
        _require_column(name, "keep column", columns, source_name, listing)
    return RowPlan(
        shape=shape,
        prompt_field=prompt_field,
        id_field=_id_field(columns, shape, id_column),
        keep_columns=keep,
        kept_as_json_text=kept_as_json_text,
    )


def _id_field(columns: Sequence[str], shape: str, id_column: str | None) -> str | None:
    if id_column is not None:
        return id_column
    if shape == "openai":
        return "custom_id"
    for name in ("id", "custom_id"):
        if name in columns:
            return name
    return None


def _require_column(
    name: str, role: str, columns: Sequence[str], source_name: str, listing: str
) -> None:
    if name not in columns:
        raise InputError(f"{role} {name!r} not found in {source_name}; columns are: {listing}")
