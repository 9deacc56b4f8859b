"""An OpenAI line's tools, tool-call history and reasoning_effort reach the chat template as
transformers' templates take them (tool-call arguments as objects, written by the template)."""

from __future__ import annotations

import copy
import json

from astrai_batch.io import open_input
from astrai_batch.jobs.planning.tokenize import PromptEncoder

TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for tool in tools %}{{ tool.function.name }};{% endfor %}"
    "</tools>\n{% endif %}"
    "{% if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    '{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": '
    '"{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}"
    "{% elif m.role == 'tool' %}[{{ m.tool_call_id }}] {{ m.content }}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def test_tools_history_and_effort_reach_the_template(tiny_tokenizer, tmp_path) -> None:
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    ]
    body = {"messages": messages, "tools": [WEATHER], "reasoning_effort": "low"}
    line = {"custom_id": "r", "url": "/v1/chat/completions", "body": body}
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n")
    [row] = open_input(tmp_path / "in.jsonl").iter_rows()
    assert PromptEncoder(tokenizer, "tiny").render_chat(row) == (
        "<tools>get_weather;</tools>\n"
        "effort=low\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n[call_1] 21C<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
