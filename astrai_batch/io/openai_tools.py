"""Tools in OpenAI chat lines: ``tools`` / ``tool_choice`` and the legacy ``functions`` /
``function_call``, read into what the job does with them.

- ``none`` (or no tools): plain generation; the template does not see the tools.
- a named function (``{"type": "function", "function": {"name": N}}``, legacy
  ``{"name": N}``): the function's parameter schema becomes the row's constraint (the
  structured-output path), the output is that function's arguments.
- ``required``: the output is constrained to a JSON array of at least one
  ``{"name", "parameters"}`` object, each naming one of the tools with its arguments.
- ``auto`` (the default when tools are given): the model chooses; the job's
  ``--tool-call-parser`` reads calls out of its text (`tool_parsers`).

In every case but ``none`` the chat template receives the tools as OpenAI writes them (the
form transformers' templates take). `ToolChoice.mode` says how the output is read:
``auto``, ``required`` or ``function:NAME``.
Row errors: ``body.tools must be a list of function tools, got object``,
``body.tools[0] must be {"type": "function", "function": {...}}``,
``body.tools[0].function.name must be a non-empty string``,
``body.tool_choice must be none, auto, required or {"type": "function", "function":
{"name": ...}}, got 'any'``, ``body.tool_choice names 'g', which is not one of the tools ('f')``,
``body.tool_choice is required but no tools are given``, ``give tools or functions, not
both``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astrai_batch.io.rows import RowProblem
from astrai_batch.json_types import json_type

CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolChoice:
    """A line's tools (for the chat template) and how its output is read (`mode`)."""

    tools: tuple[Mapping[str, Any], ...]
    mode: str  # "auto" | "required" | "function:NAME"

    def constraint(self) -> dict[str, Any] | None:
        """The row's constraint override (``{"constraint": ...}``), None for auto."""
        by_name = {tool["function"]["name"]: tool["function"] for tool in self.tools}
        if self.mode.startswith("function:"):
            schema = parameters_of(by_name[self.mode.removeprefix("function:")])
        elif self.mode == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "parameters": parameters_of(f)},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, f in by_name.items()
            ]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        else:
            return None
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        return {"constraint": {"kind": "json_schema", "text": text}}


def parameters_of(function: Mapping[str, Any]) -> Mapping[str, Any]:
    return function.get("parameters") or EMPTY_PARAMETERS


def parse_tool_choice(body: Mapping[str, Any]) -> ToolChoice | None:
    """The line's `ToolChoice`, or None when it asks for no tool calls; raises RowProblem."""
    tools_value, functions_value = body.get("tools"), body.get("functions")
    if tools_value and functions_value:
        raise RowProblem("give tools or functions, not both")
    if functions_value:
        tools = _functions(functions_value)
        choice = _legacy_choice(body.get("function_call"))
    else:
        tools = _tools(tools_value)
        choice = _choice(body.get("tool_choice"))
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    field_name = "body.function_call" if functions_value else "body.tool_choice"
    if not tools:
        raise RowProblem(f"{field_name} is {_shown(choice)} but no tools are given")
    names = [tool["function"]["name"] for tool in tools]
    if choice.startswith("function:") and choice.removeprefix("function:") not in names:
        listed = ", ".join(repr(name) for name in names)
        raise RowProblem(
            f"{field_name} names {choice.removeprefix('function:')!r}, which is not one of "
            f"the tools ({listed})"
        )
    return ToolChoice(tuple(tools), choice)


def _shown(choice: str) -> str:
    return f"function {choice.removeprefix('function:')!r}" if ":" in choice else choice


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RowProblem(f"body.tools must be a list of function tools, got {json_type(value)}")
    tools = []
    for position, tool in enumerate(value):
        where = f"body.tools[{position}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise RowProblem(f'{where} must be {{"type": "function", "function": {{...}}}}')
        tools.append({"type": "function", "function": _function(tool.get("function"), where)})
    return tools


def _functions(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise RowProblem(f"body.functions must be a list of functions, got {json_type(value)}")
    return [
        {"type": "function", "function": _function(function, f"body.functions[{position}]")}
        for position, function in enumerate(value)
    ]


def _function(value: Any, where: str) -> dict[str, Any]:
    field_name = f"{where}.function" if where.startswith("body.tools") else where
    if not isinstance(value, Mapping):
        raise RowProblem(f"{field_name} must be an object, got {json_type(value)}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise RowProblem(f"{field_name}.name must be a non-empty string")
    parameters = value.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise RowProblem(f"{field_name}.parameters must be an object, got {json_type(parameters)}")
    return {key: item for key, item in value.items() if item is not None}


def _choice(value: Any) -> str | None:
    if value is None or value in CHOICES:
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return f"function:{function['name']}"
    raise RowProblem(
        'body.tool_choice must be none, auto, required or {"type": "function", "function": '
        f'{{"name": ...}}}}, got {_value_text(value)}'
    )


def _legacy_choice(value: Any) -> str | None:
    if value is None or value in ("none", "auto"):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):
        return f"function:{value['name']}"
    raise RowProblem(
        f'body.function_call must be none, auto or {{"name": ...}}, got {_value_text(value)}'
    )


def _value_text(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_type(value)
