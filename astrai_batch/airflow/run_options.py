"""The options of `astrai-batch run`, as the Airflow operator checks them when a DAG is parsed.

The operator runs the CLI in another process (often another environment, with torch), so the
DAG parser must not import the CLI. `run_options.json` beside this module is the CLI's option
list (name, flag, kind, choices), written by `spec_of_command(cli.run)`; a test in the default
suite keeps it equal to the command's, so the list cannot drift from the CLI.

Option names are the TOML config's: `max_tokens` (dashes are accepted: `max-tokens`). A value
holding a Jinja expression is checked after Airflow renders it, at run time.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SPEC_PATH = Path(__file__).with_name("run_options.json")
KINDS = ("flag", "switch", "int", "float", "str", "choice")


def spec_of_command(command: Any) -> dict[str, dict[str, Any]]:
    """name -> {flag, kind, multiple, choices?, off?} for every option of a click command."""
    import click

    spec: dict[str, dict[str, Any]] = {}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        entry: dict[str, Any] = {"flag": max(param.opts, key=len), "multiple": param.multiple}
        if param.is_flag and param.secondary_opts:
            entry |= {"kind": "switch", "off": max(param.secondary_opts, key=len)}
        elif param.is_flag:
            entry["kind"] = "flag"
        elif isinstance(param.type, click.Choice):
            entry |= {"kind": "choice", "choices": [str(c) for c in param.type.choices]}
        elif isinstance(param.type, click.types.IntParamType):
            entry["kind"] = "int"
        elif isinstance(param.type, click.types.FloatParamType):
            entry["kind"] = "float"
        else:
            entry["kind"] = "str"
        spec[param.name] = entry
    return spec


def load_spec() -> dict[str, dict[str, Any]]:
    return json.loads(SPEC_PATH.read_text())


def is_templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class OptionError(ValueError):
    """An option the CLI would refuse, named as the DAG's author wrote it."""


def check_options(
    options: Mapping[str, Any],
    spec: Mapping[str, Mapping[str, Any]],
    *,
    rendered: bool,
) -> dict[str, Any]:
    """The options keyed by the CLI's names; raises OptionError on an unknown name or a
    value of the wrong kind. Before rendering (`rendered` False), templated values pass."""
    if not isinstance(options, Mapping):
        raise OptionError(f"options must be a mapping of option names to values, got {options!r}")
    checked: dict[str, Any] = {}
    for raw_name, value in options.items():
        name = str(raw_name).removeprefix("--").replace("-", "_")
        entry = spec.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, list(spec), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(
                f"unknown option {raw_name!r}{hint}; options are `astrai-batch run`'s, named as "
                "in its TOML config (max_tokens for --max-tokens)"
            )
        if name in checked:
            raise OptionError(f"option {name!r} is given twice")
        values = list(value) if entry["multiple"] and isinstance(value, (list, tuple)) else [value]
        for item in values:
            if value is None or (not rendered and is_templated(item)):
                continue
            _check_value(name, entry, item)
        checked[name] = value
    return checked


def _check_value(name: str, entry: Mapping[str, Any], value: Any) -> None:
    kind = entry["kind"]
    ok = {
        "flag": isinstance(value, bool),
        "switch": isinstance(value, bool),
        "int": (isinstance(value, int) and not isinstance(value, bool)) or _parses(value, int),
        "float": (isinstance(value, (int, float)) and not isinstance(value, bool))
        or _parses(value, float),
        "str": isinstance(value, (str, int, float)) and not isinstance(value, bool),
        "choice": str(value) in entry.get("choices", ()),
    }[kind]
    if ok:
        return
    expected = {
        "flag": "true or false",
        "switch": "true or false",
        "int": "an integer",
        "float": "a number",
        "str": "a string",
        "choice": "one of " + ", ".join(entry.get("choices", ())),
    }[kind]
    raise OptionError(f"option {name!r} must be {expected}, got {value!r}")


def _parses(value: Any, kind: type) -> bool:
    """A rendered template is text: "64" is an integer there."""
    if not isinstance(value, str):
        return False
    try:
        kind(value)
    except ValueError:
        return False
    return True


def command_arguments(
    options: Mapping[str, Any], spec: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The `run` flags for checked options (None leaves an option at its default)."""
    arguments: list[str] = []
    for name, value in options.items():
        entry = spec[name]
        if value is None:
            continue
        if entry["kind"] == "flag":
            arguments += [entry["flag"]] if value else []
        elif entry["kind"] == "switch":
            arguments.append(entry["flag"] if value else entry["off"])
        else:
            items: Sequence[Any] = (
                value if entry["multiple"] and isinstance(value, (list, tuple)) else [value]
            )
            for item in items:
                arguments += [entry["flag"], str(item)]
    return arguments
