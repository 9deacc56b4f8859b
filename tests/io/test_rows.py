from __future__ import annotations

import re

import pytest

from astrai_batch.io import InputRow, RowPlan


def test_valid_row_needs_exactly_one_prompt_field() -> None:
    message = (
        "exactly one of prompt, messages, prompt_token_ids must be set on a valid row, got none"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        InputRow(index=0, id="0")
    with pytest.raises(ValueError, match=r"got \['prompt', 'prompt_token_ids'\]$"):
        InputRow(index=0, id="0", prompt="a", prompt_token_ids=(1,))


def test_error_row_carries_no_prompt() -> None:
    with pytest.raises(
        ValueError, match=r"^a row with an error carries no prompt, got \['prompt'\]$"
    ):
        InputRow(index=0, id="0", prompt="a", error="bad")
    assert InputRow(index=0, id="0", error="bad").kind == "completion"


def test_index_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=r"^index must be >= 0, got -1$"):
        InputRow(index=-1, id="x", prompt="a")


def test_kind() -> None:
    assert InputRow(index=0, id="0", messages=({"role": "user", "content": "a"},)).kind == "chat"
    assert InputRow(index=0, id="0", prompt_token_ids=(1,)).kind == "completion"


def test_valid_row_has_an_id() -> None:
    with pytest.raises(ValueError, match=r"^a valid row has an id$"):
        InputRow(index=0, id=None, prompt="a")
    assert InputRow(index=0, id=None, error="id is missing").id is None


def test_row_plan_validation() -> None:
    with pytest.raises(ValueError, match=r"^prompt_column_shape must be prompt, messages or "):
        RowPlan(prompt_column="p", prompt_column_shape="openai")
    with pytest.raises(ValueError, match=r"^prompt_column must be a non-empty column name$"):
        RowPlan(prompt_column="")
    with pytest.raises(ValueError, match=r"^keep_columns has duplicates: \['a', 'a'\]$"):
        RowPlan(keep_columns=("a", "a"))


def test_source_columns_lists_only_what_exists() -> None:
    plan = RowPlan(prompt_column="text", id_column="uid", keep_columns=("tag",))
    available = ["tag", "other", "seed", "text", "uid", "stop", "custom_id", "ignore_eos"]
    assert plan.source_columns(available) == [
        "text",
        "seed",
        "stop",
        "ignore_eos",
        "uid",
        "custom_id",
        "tag",
    ]
    per_row = RowPlan()
    assert per_row.source_columns(["body", "custom_id", "seed", "prompt", "x"]) == [
        "prompt",
        "custom_id",
        "body",
        "seed",
    ]
