"""Type names for messages in the user's terms.

Values reach the checks from JSON lines, Parquet columns, TOML files and the command line; the
user knows them by their JSON names (``string``, ``integer``, ``number``, ``boolean``,
``list``, ``object``, ``null``), never by Python's (``str``, ``int``, ``dict``, ``NoneType``).
Every layer may import this module: it imports nothing of the package.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Iterable, Mapping
from typing import Any

# Checked in this order: bool before int, since Python's bool is an int.
_JSON_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"),
    (int, "integer"),
    ((float, decimal.Decimal), "number"),
    (str, "string"),
    ((list, tuple), "list"),
    (Mapping, "object"),
    ((bytes, bytearray), "binary"),
    (datetime.datetime, "timestamp"),
    (datetime.date, "date"),
)


def json_type(value: Any) -> str:
    """The JSON name of `value`'s type (Parquet-only types by their Parquet names)."""
    if value is None:
        return "null"
    for python_type, name in _JSON_NAMES:
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def first_non_count(values: Iterable[Any]) -> tuple[int, str] | None:
    """The position of the first item that is not a non-negative integer, with what it is
    (its JSON type, or the negative number); None when every item is one. Booleans are not
    integers here: ``true`` in a token list is a data bug, not token 1."""
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int):
            return position, json_type(value)
        if value < 0:
            return position, str(value)
    return None


def json_error_text(exc: json.JSONDecodeError) -> str:
    """Where JSON text is not valid, in one phrase: ``Expecting value at column 1``; json's
    messages that end in "at" (``Unterminated string starting at``) get the column alone."""
    joint = " column" if exc.msg.endswith(" at") else " at column"
    return f"{exc.msg}{joint} {exc.colno}"


def parse_json(text: str) -> Any:
    """The value of JSON `text`; ValueError saying where it is not valid
    (``Expecting value at column 1``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(json_error_text(exc)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def json_object(value: Any, name: str) -> dict[str, Any]:
    """`value`, an object or JSON text of one (a flag, a Parquet string column), as a dict;
    ValueError naming `name` otherwise."""
    if isinstance(value, str):
        try:
            value = parse_json(value)
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be an object, got {json_type(value)}")
    return dict(value)
