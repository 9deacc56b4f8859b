"""The row fields of one task only, checked against the job's task.

`--task score` rows hold a context (the prompt column, ``context`` unless ``--prompt-column``
says otherwise: a string, or messages whose rendered template stands for the context) and
``continuations``, a non-empty list of non-empty strings; sampling fields and constraints
mean nothing there and are refused. A generation row must not carry ``continuations``.
Errors (exact): ``continuations is missing``, ``continuations is empty``,
``continuations must be a list of strings, got string``, ``continuations[1] must be a
string, got integer``, ``continuations[2] is empty``, ``max_tokens is not a field of --task
score``, ``continuations is a field of --task score``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.rows import CONSTRAINT_COLUMNS, OVERRIDE_FIELDS, RowProblem
from astrai_batch.json_types import json_type

TASKS = ("generate", "score", "embed")


def task_fields(record: Mapping[str, Any], task: str, shape: str | None) -> tuple[str, ...] | None:
    """The row's continuations (score), or None (generate); raises RowProblem."""
    value = record.get("continuations")
    if task == "embed":
        if value is not None:
            raise RowProblem("continuations is a field of --task score")
        if shape != "openai":
            for name in (*OVERRIDE_FIELDS, *CONSTRAINT_COLUMNS):
                if record.get(name) is not None:
                    raise RowProblem(f"{name} is not a field of --task embed")
        elif record.get("url") != "/v1/embeddings":
            raise RowProblem(f"--task embed reads /v1/embeddings lines, got {record.get('url')!r}")
        return None
    if task != "score":
        if value is not None and shape != "openai":
            raise RowProblem("continuations is a field of --task score")
        return None
    for name in (*OVERRIDE_FIELDS, *CONSTRAINT_COLUMNS):
        if record.get(name) is not None:
            raise RowProblem(f"{name} is not a field of --task score")
    if value is None:
        raise RowProblem("continuations is missing")
    if not isinstance(value, (list, tuple)):
        raise RowProblem(f"continuations must be a list of strings, got {json_type(value)}")
    if not value:
        raise RowProblem("continuations is empty")
    for number, text in enumerate(value):
        if not isinstance(text, str):
            raise RowProblem(f"continuations[{number}] must be a string, got {json_type(text)}")
        if not text:
            raise RowProblem(f"continuations[{number}] is empty")
    return tuple(value)
