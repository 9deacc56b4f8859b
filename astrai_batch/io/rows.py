"""One input row as the rest of the job sees it, and the plan that says how to build it.

Readers (Parquet, JSONL) turn each stored record into a plain dict; `row_parsing` then turns
that dict into an `InputRow` following a `RowPlan`, so both formats share every rule and every
error message.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from astrai_batch.errors import AstraiBatchError

SHAPES = ("prompt", "messages", "prompt_token_ids", "openai")

# Per-row sampling overrides read from top-level columns (prompt / messages / token-id rows).
OVERRIDE_FIELDS = (
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
)

# Per-row output constraints of plain rows (io/constraint_fields.py reads them).
CONSTRAINT_COLUMNS = ("json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class InputRow:
    """A prompt to run, or the reason the stored record cannot be one.

    `index` is the 0-based position across the whole input and is the order key of the output.
    When `error` is None exactly one of `prompt`, `messages`, `prompt_token_ids` is set; when it
    is set none of them is, and `overrides` is empty. `kept` always has every keep column.
    """

    index: int
    id: str
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    kept: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    custom_id: str | None = None

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        contents = [
            name
            for name in ("prompt", "messages", "prompt_token_ids")
            if getattr(self, name) is not None
        ]
        if self.error is None and len(contents) != 1:
            raise ValueError(
                "exactly one of prompt, messages, prompt_token_ids must be set on a valid row, "
                f"got {contents or 'none'}"
            )
        if self.error is not None and contents:
            raise ValueError(f"a row with an error carries no prompt, got {contents}")

    @property
    def kind(self) -> str:
        """'chat' for message rows, 'completion' for raw prompts and token ids."""
        return "chat" if self.messages is not None else "completion"


@dataclass(frozen=True)
class RowPlan:
    """How to read one record: which field holds the prompt and which hold the rest.

    `prompt_field` names the column with the prompt, messages or token ids; OpenAI rows use the
    fixed fields custom_id / method / url / body. `kept_as_json_text` is set for JSONL, whose
    keep columns are written as strings (JSON has no column types to carry over).
    """

    shape: str
    prompt_field: str
    id_field: str | None
    keep_columns: tuple[str, ...] = ()
    kept_as_json_text: bool = False

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if not self.prompt_field:
            raise ValueError("prompt_field must be a non-empty column name")
        if len(set(self.keep_columns)) != len(self.keep_columns):
            raise ValueError(f"keep_columns has duplicates: {list(self.keep_columns)}")

    def source_columns(self, available: Collection[str]) -> list[str]:
        """The columns a reader must load for this plan, in a stable order."""
        wanted: list[str] = []
        if self.shape == "openai":
            wanted += ["custom_id", "method", "url", "body"]
        else:
            wanted.append(self.prompt_field)
            wanted += OVERRIDE_FIELDS
            wanted += CONSTRAINT_COLUMNS
        if self.id_field is not None:
            wanted.append(self.id_field)
        wanted += self.keep_columns
        present = set(available)
        return list(dict.fromkeys(name for name in wanted if name in present))


class RowProblem(AstraiBatchError):
    """Raised while parsing one record; always caught and turned into `InputRow.error`."""


def type_name(value: Any) -> str:
    """The Python type name used in row error messages ('int', 'list', 'NoneType')."""
    return type(value).__name__


def stringify_id(value: Any) -> str:
    """Row ids are strings: strings stay, JSON scalars and containers become JSON text."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float, list, dict)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def json_text(value: Any) -> str | None:
    """A JSONL keep-column value as stored in the output: strings as-is, the rest as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
