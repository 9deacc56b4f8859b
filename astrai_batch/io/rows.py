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
from astrai_batch.io.image_sources import ImageRef

SHAPES = ("prompt", "messages", "prompt_token_ids", "openai")
# What an input as a whole holds: one of SHAPES, or "mixed" when its rows differ.
# "empty": a JSONL input without lines, whose rows (none) have no shape to tell
SOURCE_SHAPES = (*SHAPES, "mixed", "empty")

# The fields whose value makes a row one of the plain shapes, in the order a row's non-null
# fields are tried; a row with none of them and a ``body`` is an OpenAI request line.
PLAIN_SHAPE_FIELDS = ("messages", "prompt_token_ids", "prompt")
OPENAI_FIELDS = ("custom_id", "method", "url", "body")

# Where a row's id comes from without --id-column: the first of these that is not null.
ID_FIELDS = ("id", "custom_id")

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
    "stop_token_ids",
    "ignore_eos",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
)
# Fields of one task only (see io/task_fields.py).
TASK_FIELDS = ("continuations",)
# Extra variables for the chat template of this row, merged over --chat-template-kwargs.
TEMPLATE_KWARGS_FIELD = "chat_template_kwargs"
# The LoRA adapter a plain row runs with (null or missing: the base model).
LORA_FIELD = "lora"

# Per-row output constraints of plain rows (io/constraint_fields.py reads them).
CONSTRAINT_COLUMNS = ("json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class BestOf:
    """Completions' ``best_of``: of the row's samples, return the `keep` likeliest (sum of
    logprobs), with their logprobs only when the line asked for them."""

    keep: int
    logprobs: bool


@dataclass(frozen=True)
class InputRow:
    """A prompt to run, or the reason the stored record cannot be one.

    `index` is the 0-based position across the whole input and is the order key of the output.
    When `error` is None exactly one of `prompt`, `messages`, `prompt_token_ids` is set; when it
    is set none of them is, and `overrides` is empty. Only a messages row has `images`.
    `kept` always has every keep column.
    `id` is None only on an error row whose id is missing or repeats an earlier row's, so no
    two rows of an input ever share an id. `custom_id` is the row's own ``custom_id`` (a
    string), None when it has none or it repeats an earlier row's id.
    """

    index: int
    id: str | None
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    kept: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    custom_id: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    lora: str | None = None  # the row's `lora` field: an adapter name
    model: str | None = None  # an OpenAI line's body.model (an adapter's name picks it)
    continuations: tuple[str, ...] | None = None  # a --task score row's continuations
    # an OpenAI line's body fields the job ignores (`io.openai_fields`): it warns once each
    ignored_fields: tuple[str, ...] = ()
    # an OpenAI chat line's tools (given to the chat template) and how its output is read:
    # "auto", "required" or "function:NAME" (`io.openai_tools`); None: no tool calls
    tools: tuple[Mapping[str, Any], ...] | None = None
    tool_choice: str | None = None
    # an OpenAI completions line's echo: "with_completion", or "prompt" (max_tokens 0)
    echo: str | None = None
    # an OpenAI /v1/embeddings line: its encoding_format ("float" or "base64")
    embedding: str | None = None
    best_of: BestOf | None = None  # an OpenAI completions line's best_of above its n
    # the row's images in the order it names them (`io.image_parts`); each stands at a
    # {"type": "image"} part of `messages`, decoded only when its window runs
    images: tuple[ImageRef, ...] = ()

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
        if self.error is None and self.id is None:
            raise ValueError("a valid row has an id")
        if self.images and self.messages is None:
            raise ValueError("only a messages row has images")

    @property
    def kind(self) -> str:
        """'chat' for message rows, 'completion' for raw prompts and token ids."""
        return "chat" if self.messages is not None else "completion"


@dataclass(frozen=True)
class RowPlan:
    """How to read the records of one input; each record's own fields decide its shape.

    `prompt_column` (``--prompt-column``) names the one field every row's prompt comes from;
    `prompt_column_shape` fixes its shape where the input's types do (a Parquet column), else
    each value's type decides. `id_column` (``--id-column``) replaces the default id fields.
    `has_ids` tells whether the input has an id field at all: without one, rows are numbered;
    with one, a row without an id is an error row. `json_text_columns` are keep columns
    written as JSON text: JSONL columns whose values have no one type (`kept_types`).
    """

    prompt_column: str | None = None
    prompt_column_shape: str | None = None
    id_column: str | None = None
    has_ids: bool = False
    keep_columns: tuple[str, ...] = ()
    json_text_columns: tuple[str, ...] = ()
    task: str = "generate"  # "score": rows also hold `continuations` (io/task_fields.py)

    def __post_init__(self) -> None:
        if self.prompt_column == "":
            raise ValueError("prompt_column must be a non-empty column name")
        if self.prompt_column_shape is not None and self.prompt_column_shape not in SHAPES[:3]:
            raise ValueError(
                "prompt_column_shape must be prompt, messages or prompt_token_ids, "
                f"got {self.prompt_column_shape!r}"
            )
        if len(set(self.keep_columns)) != len(self.keep_columns):
            raise ValueError(f"keep_columns has duplicates: {list(self.keep_columns)}")

    @property
    def id_fields(self) -> tuple[str, ...]:
        """The fields a row id is read from, first non-null wins."""
        return (self.id_column,) if self.id_column is not None else ID_FIELDS

    def source_columns(self, available: Collection[str]) -> list[str]:
        """The columns a reader must load for this plan, in a stable order."""
        if self.prompt_column is not None:
            wanted = [self.prompt_column]
        else:
            wanted = [*PLAIN_SHAPE_FIELDS, *OPENAI_FIELDS]
        wanted += [
            *OVERRIDE_FIELDS,
            *CONSTRAINT_COLUMNS,
            TEMPLATE_KWARGS_FIELD,
            LORA_FIELD,
            *self.id_fields,
            "custom_id",
        ]
        wanted += [*TASK_FIELDS, *self.keep_columns]
        present = set(available)
        return list(dict.fromkeys(name for name in wanted if name in present))


class RowProblem(AstraiBatchError):
    """Raised while parsing one record; always caught and turned into `InputRow.error`."""


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
