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


def test_row_plan_validation() -> None:
    with pytest.raises(ValueError, match=r"^shape must be one of prompt, messages, "):
        RowPlan(shape="csv", prompt_field="p", id_field=None)
    with pytest.raises(ValueError, match=r"^prompt_field must be a non-empty column name$"):
        RowPlan(shape="prompt", prompt_field="", id_field=None)
    with pytest.raises(ValueError, match=r"^keep_columns has duplicates: \['a', 'a'\]$"):
        RowPlan(shape="prompt", prompt_field="p", id_field=None, keep_columns=("a", "a"))


def test_source_columns_lists_only_what_exists() -> None:
    plan = RowPlan(shape="prompt", prompt_field="text", id_field="uid", keep_columns=("tag",))
    available = ["tag", "other", "seed", "text", "uid", "stop"]
    assert plan.source_columns(available) == ["text", "seed", "stop", "uid", "tag"]
    openai = RowPlan(shape="openai", prompt_field="body", id_field="custom_id")
    assert openai.source_columns(["body", "custom_id", "seed"]) == ["custom_id", "body"]
