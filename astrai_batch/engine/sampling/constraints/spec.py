"""What a row's output must match, as plain data (no torch, no backend library).

A `Constraint` is a kind and a canonical text. Equal constraints written differently (JSON
with other spacing, a schema given as an object or as JSON text) have equal texts, so their
`digest` is equal and the engine compiles them once.

- ``json_schema``: the schema as compact JSON text (key order kept: properties are generated
  in the order the schema lists them);
- ``json_object``: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``);
  the text is empty;
- ``regex``: the pattern; the whole output must match it;
- ``choice``: a JSON list of the allowed outputs; the output is exactly one of them;
- ``grammar``: an EBNF grammar (xgrammar / GBNF dialect) whose start rule is ``root``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astrai_batch.errors import ConfigError

CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraint:
    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ConfigError(
                f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.text, str):
            raise ConfigError(f"constraint text must be a string, got {type(self.text).__name__}")
        if self.kind == "json_object":
            if self.text:
                raise ConfigError("a json_object constraint has no text")
        elif not self.text:
            raise ConfigError(f"{self.kind} must not be empty")
        if self.kind == "choice":
            _check_choices(self.text)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> Constraint:
        return cls("json_schema", canonical_json(schema))

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...]) -> Constraint:
        return cls("choice", canonical_json(list(options)))

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed outputs of a choice constraint."""
        if self.kind != "choice":
            raise ValueError(f"a {self.kind} constraint has no choices")
        return tuple(json.loads(self.text))

    @property
    def digest(self) -> str:
        """The key of the compiled grammar: equal for equal constraints, whatever the row."""
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode()).hexdigest()

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}

    @classmethod
    def from_dict(cls, values: Any) -> Constraint:
        if isinstance(values, Constraint):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"constraint must be a mapping, got {type(values).__name__}")
        unknown = sorted(str(key) for key in values if key not in ("kind", "text"))
        if unknown:
            raise ConfigError(f"unknown constraint field(s): {', '.join(unknown)}")
        return cls(values.get("kind"), values.get("text", ""))  # type: ignore[arg-type]


def canonical_json(value: Any) -> str:
    """Compact JSON text with key order kept (order is meaningful in a schema)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _check_choices(text: str) -> None:
    try:
        options = json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError("choice text must be a JSON list of strings") from None
    if not isinstance(options, list) or not options:
        raise ConfigError("choice must be a non-empty list of strings")
    for option in options:
        if not isinstance(option, str) or not option:
            raise ConfigError(f"choice must contain only non-empty strings, got {option!r}")
