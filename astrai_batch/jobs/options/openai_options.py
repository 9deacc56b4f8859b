"""The options of OpenAI batch lines: the names the job serves its model under
(`--served-model-name`, repeatable, as vLLM's), which `body.model` must name, and the parsers
that read tool calls (`--tool-call-parser`) and reasoning (`--reasoning-parser`) out of the
model's text."""

from __future__ import annotations

from typing import Any

from astrai_batch.errors import ConfigError
from astrai_batch.io.reasoning_parsers import REASONING_PARSERS
from astrai_batch.io.tool_parsers import TOOL_PARSERS
from astrai_batch.json_types import json_type


def parse_served_names(value: Any) -> tuple[str, ...]:
    """Names from one string (TOML) or a list of them (the repeatable flag)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise ConfigError(f"served_model_name must be names, got {json_type(value)}")
    return tuple(names)


def check_served_names(names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(name, str) or not name.strip():
            shown = repr(name) if isinstance(name, str) else json_type(name)
            raise ConfigError(f"served_model_name must be non-empty names, got {shown}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"served_model_name given twice: {', '.join(repeated)}")


def served_names(model: str, loaded_name: str, given: tuple[str, ...]) -> tuple[str, ...]:
    """What `body.model` may name for the base model: the served names when given (the first
    is the name responses carry), else the model as --model gives it and the name it loaded
    under (the name responses carry)."""
    return given or tuple(dict.fromkeys((loaded_name, model)))


def check_parsers(tool_call_parser: object, reasoning_parser: object) -> None:
    for name, value, known in (
        ("tool_call_parser", tool_call_parser, TOOL_PARSERS),
        ("reasoning_parser", reasoning_parser, REASONING_PARSERS),
    ):
        if value is not None and value not in known:
            raise ConfigError(f"{name} must be one of {', '.join(known)}, got {value!r}")
