"""Per-row output constraints as read from a record: shape checks only.

Plain rows (prompt / messages / token ids) may carry one of the columns ``json_schema`` (an
object, or JSON text of one), ``regex`` (a string), ``choice`` (a list of strings) or
``grammar`` (EBNF text); OpenAI rows carry ``response_format`` in their body. Either becomes
the override ``constraint`` = ``{"kind", "text"}`` with a canonical text (compact JSON, key
order kept), which the job turns into the engine's `Constraint`. Whether a schema, regex or
grammar actually compiles is the engine's business: it reports that in the row too.

Row error messages: ``json_schema must be an object, got list``,
``json_schema is not valid JSON: ... at column N``, ``regex must be a string, got integer``,
``regex must not be empty``, ``choice must be a list of strings, got string``,
``choice must not be empty``, ``choice[1] must be a non-empty string, got integer``,
``grammar must be a string, got object``, ``a row takes one constraint, got json_schema and
regex``, ``body.response_format must be an object, got string``,
``body.response_format.type must be text, json_object or json_schema, got 'xml'``,
``body.response_format.json_schema is missing``,
``body.response_format.json_schema.schema must be an object, got string``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.rows import CONSTRAINT_COLUMNS, RowProblem
from astrai_batch.json_types import json_object, json_type

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


def constraint_override(record: Mapping[str, Any]) -> dict[str, Any]:
    """``{"constraint": {...}}`` from the constraint columns of a plain row, or ``{}``."""
    given = [name for name in CONSTRAINT_COLUMNS if record.get(name) is not None]
    if not given:
        return {}
    if len(given) > 1:
        raise RowProblem(f"a row takes one constraint, got {' and '.join(given)}")
    name = given[0]
    value = record[name]
    if name == "json_schema":
        return _override("json_schema", _canonical(_schema_object(value, name)))
    if name == "choice":
        return _override("choice", _canonical(_choices(value, name)))
    return _override(name, _text(value, name))


def response_format_override(value: Any, field_name: str) -> dict[str, Any]:
    """``{"constraint": {...}}`` for an OpenAI ``response_format``, ``{}`` for type text."""
    if not isinstance(value, Mapping):
        raise RowProblem(f"{field_name} must be an object, got {json_type(value)}")
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise RowProblem(
            f"{field_name}.type must be text, json_object or json_schema, got {kind!r}"
        )
    if kind == "text":
        return {}
    if kind == "json_object":
        return _override("json_object", "")
    spec = value.get("json_schema")
    if spec is None:
        raise RowProblem(f"{field_name}.json_schema is missing")
    if not isinstance(spec, Mapping):
        raise RowProblem(f"{field_name}.json_schema must be an object, got {json_type(spec)}")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise RowProblem(
            f"{field_name}.json_schema.schema must be an object, got {json_type(schema)}"
        )
    return _override("json_schema", _canonical(schema))


def _override(kind: str, text: str) -> dict[str, Any]:
    return {"constraint": {"kind": kind, "text": text}}


def _schema_object(value: Any, name: str) -> Mapping[str, Any]:
    try:
        return json_object(value, name)
    except ValueError as exc:
        raise RowProblem(str(exc)) from None


def _choices(value: Any, name: str) -> list[str]:
    if isinstance(value, (str, Mapping)) or not hasattr(value, "__iter__"):
        raise RowProblem(f"{name} must be a list of strings, got {json_type(value)}")
    options = list(value)
    if not options:
        raise RowProblem(f"{name} must not be empty")
    for position, option in enumerate(options):
        if not isinstance(option, str) or not option:
            raise RowProblem(
                f"{name}[{position}] must be a non-empty string, got {json_type(option)}"
            )
    return options


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RowProblem(f"{name} must be a string, got {json_type(value)}")
    if not value:
        raise RowProblem(f"{name} must not be empty")
    return value


def _canonical(value: Any) -> str:
    # Compact, key order kept: the same text as `Constraint.json_schema`, so equal schemas
    # from different rows share one compiled grammar.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
