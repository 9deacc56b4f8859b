"""The Arrow types of a JSONL input's keep columns, inferred from every value the open scan
reads, as pyarrow infers them: numbers stay numbers (integers and floats together become
double), lists lists and objects structs (their fields merged over the rows). A column whose
values have no one type (a number here, a string there) is kept as JSON text, and so is a
column with no value at all as a string column of nulls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

# Python's JSON scalars and their Arrow types; anything else asks pyarrow.
_SCALAR_TYPES = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


class KeptTypes:
    """Accumulates the type of each keep column over the values `add` is given."""

    def __init__(self, names: Iterable[str]) -> None:
        self._types: dict[str, pa.DataType | None] = dict.fromkeys(names)
        self._text: set[str] = set()

    def add(self, record: Mapping[str, Any]) -> None:
        for name, current in self._types.items():
            value = record.get(name)
            if value is None or name in self._text:
                continue
            found = _value_type(value)
            if found is None:
                self._text.add(name)
            elif current is None:
                self._types[name] = found
            elif found != current:
                merged = _merged(current, found)
                if merged is None:
                    self._text.add(name)
                else:
                    self._types[name] = merged

    @property
    def json_text_columns(self) -> tuple[str, ...]:
        """The columns written as JSON text: no one type, or no value at all."""
        return tuple(
            name for name, kind in self._types.items() if name in self._text or kind is None
        )

    def schema(self) -> pa.Schema:
        text = set(self.json_text_columns)
        return pa.schema(
            [
                pa.field(name, pa.string() if name in text else kind)
                for name, kind in self._types.items()
            ]
        )


def _value_type(value: Any) -> pa.DataType | None:
    scalar = _SCALAR_TYPES.get(type(value))
    if scalar is not None:
        if scalar == pa.int64() and not -(2**63) <= value < 2**63:
            return None  # beyond int64: kept as JSON text, never rounded
        return scalar
    try:
        return pa.array([value]).type
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return None  # a list of mixed types, say


def _merged(first: pa.DataType, second: pa.DataType) -> pa.DataType | None:
    try:
        schema = pa.unify_schemas(
            [pa.schema([("value", first)]), pa.schema([("value", second)])],
            promote_options="permissive",
        )
    except (pa.ArrowException, ValueError, TypeError):
        return None
    merged = schema.field("value").type
    # permissive promotion would turn numbers and strings into strings: not one type
    return None if pa.types.is_string(merged) and first != second else merged
