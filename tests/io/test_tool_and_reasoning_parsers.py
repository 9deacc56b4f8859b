"""Tool-call and reasoning parsers on fixed model texts, one format each (the texts are
written as each model family's chat format has its model write them)."""

from __future__ import annotations

import json

import pytest

from astrai_batch.io.reasoning_parsers import split_reasoning
from astrai_batch.io.tool_parsers import ToolCall, parse_tool_calls

WEATHER = ToolCall("get_weather", json.dumps({"city": "Paris", "unit": "C"}))
TIME = ToolCall("get_time", json.dumps({"zone": "CET"}))


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        (
            "hermes",
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",'
            ' "unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
            '{"zone": "CET"}}\n</tool_call>',
            "Let me check.",
            [WEATHER, TIME],
        ),
        (
            "hermes",
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
            None,
            [TIME],
        ),
        (
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}',
            None,
            [WEATHER],
        ),
        (
            "llama3_json",
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
            '"C"}}; {"name": "get_time", "arguments": {"zone": "CET"}}',
            None,
            [WEATHER, TIME],
        ),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},'
            ' {"name": "get_time", "arguments": {"zone": "CET"}}]</s>',
            None,
            [WEATHER, TIME],
        ),
        (
            "mistral",
            'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "C"}'
            '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}',
            "Sure. ",
            [WEATHER, TIME],
        ),
        (
            "harmony",
            "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather "
            '<|constrain|>json<|message|>{"city": "Paris", "unit": "C"}<|call|>',
            None,
            [WEATHER],
        ),
    ],
)
def test_each_parser_reads_its_calls(
    parser: str, text: str, content: str | None, calls: list[ToolCall]
) -> None:
    assert parse_tool_calls(parser, text) == (content, calls)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", "The weather in Paris is mild."),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off
        ("hermes", "<tool_call>\n[1, 2]\n</tool_call>"),
        ("llama3_json", "It is sunny."),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}} and more'),
        ("llama3_json", '{"parameters": {"city": "Paris"}}'),  # no name
        ("mistral", "No calls here."),
        ("mistral", "[TOOL_CALLS]get_weather{oops"),
        ("harmony", "plain text without channels"),
        ("harmony", "<|channel|>final<|message|>It is sunny.<|return|>"),
    ],
)
def test_text_that_is_not_calls_stays_content(parser: str, text: str) -> None:
    assert parse_tool_calls(parser, text) == (text, [])


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"),
    [
        (
            "deepseek_r1",
            "The sum is 4.\n</think>\n\n2 + 2 = 4.",
            "The sum is 4.\n",
            "\n\n2 + 2 = 4.",
        ),
        ("deepseek_r1", "<think>Hmm.</think>Four.", "Hmm.", "Four."),
        ("deepseek_r1", "Still thinking about 2 + 2", "Still thinking about 2 + 2", None),
        ("qwen3", "<think>\nAdd them.\n</think>\n\nFour.", "\nAdd them.\n", "\n\nFour."),
        ("qwen3", "Add them.</think>Four.", "Add them.", "Four."),
        ("qwen3", "Four.", None, "Four."),  # enable_thinking false: no think block
        ("qwen3", "<think>\nAdd them, then", "\nAdd them, then", None),  # cut off
        ("qwen3", "<think>\n\n</think>\n\nFour.", None, "\n\nFour."),
        (
            "harmony",
            "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Four.<|return|>",
            "Add them.",
            "Four.",
        ),
        ("harmony", "<|channel|>analysis<|message|>Add th", "Add th", None),
        ("harmony", "Four.", None, "Four."),
    ],
)
def test_reasoning_split(
    parser: str, text: str, reasoning: str | None, content: str | None
) -> None:
    assert split_reasoning(parser, text) == (reasoning, content)
