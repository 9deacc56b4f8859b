"""Tools in OpenAI chat lines: what each tool_choice makes of a row, tool histories, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from astrai_batch.io import open_input

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Weather in Paris?"}]
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def read(tmp_path, **body: Any):
    line = {"custom_id": "r", "method": "POST", "url": CHAT, "body": {"messages": HELLO, **body}}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(line) + "\n")
    [row] = open_input(path).iter_rows()
    return row


def constraint_schema(row) -> Any:
    constraint = row.overrides["constraint"]
    assert constraint["kind"] == "json_schema"
    return json.loads(constraint["text"])


def test_a_named_function_constrains_the_output_to_its_parameters(tmp_path) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    row = read(tmp_path, tools=[WEATHER, TIME], tool_choice=choice)
    assert row.error is None
    assert row.tool_choice == "function:get_weather"
    assert row.tools == (WEATHER, TIME)
    assert constraint_schema(row) == PARAMS
    legacy = read(tmp_path, functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    assert (legacy.tools, legacy.tool_choice, legacy.overrides) == (
        (WEATHER,),
        row.tool_choice,
        {"constraint": row.overrides["constraint"]},
    )


def test_required_constrains_to_a_list_of_calls_of_the_tools(tmp_path) -> None:
    row = read(tmp_path, tools=[WEATHER, TIME], tool_choice="required")
    assert row.tool_choice == "required"
    schema = constraint_schema(row)
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [option["properties"]["name"]["const"] for option in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    # a function without parameters takes an empty object
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


def test_auto_is_the_default_with_tools_and_none_is_plain_generation(tmp_path) -> None:
    auto = read(tmp_path, tools=[WEATHER])
    assert (auto.tool_choice, auto.tools, auto.overrides) == ("auto", (WEATHER,), {})
    none = read(tmp_path, tools=[WEATHER], tool_choice="none")
    assert (none.tool_choice, none.tools, none.error) == (None, None, None)


def test_tool_histories_keep_calls_and_replies_for_the_template(tmp_path) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    row = read(tmp_path, messages=messages, tools=[WEATHER])
    assert row.messages == (
        HELLO[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    "id": "call_1",
                }
            ],
        },
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tools": {"a": 1}}, "body.tools must be a list of function tools, got object"),
        (
            {"tools": [{"type": "web"}]},
            'body.tools[0] must be {"type": "function", "function": {...}}',
        ),
        (
            {"tools": [{"type": "function", "function": {"name": ""}}]},
            "body.tools[0].function.name must be a non-empty string",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "any"},
            'body.tool_choice must be none, auto, required or {"type": "function", "function": '
            "{\"name\": ...}}, got 'any'",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "body.tool_choice names 'g', which is not one of the tools ('get_weather')",
        ),
        ({"tool_choice": "required"}, "body.tool_choice is required but no tools are given"),
        (
            {"tools": [WEATHER], "functions": [TIME["function"]]},
            "give tools or functions, not both",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "give body.response_format or a tool_choice that forces a call, not both",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "body.messages[0].tool_calls[0].function.arguments is not valid JSON",
        ),
    ],
)
def test_bad_tools_are_row_errors(tmp_path, body: dict[str, Any], message: str) -> None:
    assert read(tmp_path, **body).error == message
