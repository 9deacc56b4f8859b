"""Constraint columns of plain rows and OpenAI `response_format`, read from JSONL and Parquet:
canonical texts, and the documented row errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.engine.sampling.constraints import Constraint
from astrai_batch.io import open_input

SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
SCHEMA_TEXT = '{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}}'


def rows_of(write_jsonl, lines: list[dict[str, Any]]):
    return list(open_input(write_jsonl("in.jsonl", lines)).iter_rows())


def constraint_of(row) -> dict[str, str] | None:
    assert row.error is None, row.error
    return row.overrides.get("constraint")


def test_plain_row_columns_become_canonical_constraints(write_jsonl) -> None:
    rows = rows_of(
        write_jsonl,
        [
            {"prompt": "p", "json_schema": SCHEMA},
            {"prompt": "p", "json_schema": json.dumps(SCHEMA, indent=4)},
            {"prompt": "p", "regex": "[0-9]+", "max_tokens": 5},
            {"prompt": "p", "choice": ["yes", "no"]},
            {"prompt": "p", "grammar": 'root ::= "a"'},
            {"prompt": "p", "json_schema": None},
        ],
    )
    assert [constraint_of(row) for row in rows] == [
        {"kind": "json_schema", "text": SCHEMA_TEXT},
        {"kind": "json_schema", "text": SCHEMA_TEXT},
        {"kind": "regex", "text": "[0-9]+"},
        {"kind": "choice", "text": '["yes","no"]'},
        {"kind": "grammar", "text": 'root ::= "a"'},
        None,
    ]
    assert rows[2].overrides["max_tokens"] == 5
    # an object and its JSON text share one compiled grammar
    digests = {Constraint.from_dict(constraint_of(row)).digest for row in rows[:2]}
    assert len(digests) == 1


def test_parquet_columns(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    table = pa.table(
        {
            "prompt": ["a", "b", "c"],
            "json_schema": [json.dumps(SCHEMA), None, None],
            "choice": [None, ["x", "y"], None],
        }
    )
    pq.write_table(table, path)
    rows = list(open_input(path).iter_rows())
    assert [constraint_of(row) for row in rows] == [
        {"kind": "json_schema", "text": SCHEMA_TEXT},
        {"kind": "choice", "text": '["x","y"]'},
        None,
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"json_schema": [1]}, "json_schema must be an object, got list"),
        (
            {"json_schema": '"text"'},
            "json_schema must be an object, got string",
        ),
        (
            {"json_schema": "{nope"},
            "json_schema is not valid JSON: "
            "Expecting property name enclosed in double quotes at column 2",
        ),
        ({"regex": 5}, "regex must be a string, got integer"),
        ({"regex": ""}, "regex must not be empty"),
        ({"choice": "yes,no"}, "choice must be a list of strings, got string"),
        ({"choice": []}, "choice must not be empty"),
        ({"choice": ["a", 2]}, "choice[1] must be a non-empty string, got integer"),
        ({"grammar": {"root": 1}}, "grammar must be a string, got object"),
        ({"regex": "a", "choice": ["a"]}, "a row takes one constraint, got regex and choice"),
    ],
)
def test_bad_constraint_columns_are_row_errors(write_jsonl, fields, message) -> None:
    rows = rows_of(write_jsonl, [{"prompt": "first"}, {"prompt": "p", **fields}])
    assert rows[0].error is None
    assert rows[1].error == message


def openai_line(response_format: Any, custom_id: str = "r") -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": response_format}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_openai_response_format(write_jsonl) -> None:
    lines = [
        openai_line({"type": "text"}, "a"),
        openai_line({"type": "json_object"}, "b"),
        openai_line(
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}},
            "c",
        ),
    ]
    rows = rows_of(write_jsonl, lines)
    assert [constraint_of(row) for row in rows] == [
        None,
        {"kind": "json_object", "text": ""},
        {"kind": "json_schema", "text": SCHEMA_TEXT},
    ]


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ("json", "body.response_format must be an object, got string"),
        (
            {"type": "xml"},
            "body.response_format.type must be text, json_object or json_schema, got 'xml'",
        ),
        ({"type": "json_schema"}, "body.response_format.json_schema is missing"),
        (
            {"type": "json_schema", "json_schema": []},
            "body.response_format.json_schema must be an object, got list",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}},
            "body.response_format.json_schema.schema must be an object, got string",
        ),
    ],
)
def test_bad_response_format_is_a_row_error(write_jsonl, response_format, message) -> None:
    rows = rows_of(
        write_jsonl, [openai_line({"type": "text"}, "a"), openai_line(response_format, "b")]
    )
    assert rows[1].error == message
