"""Turn one stored record (a plain dict) into an `InputRow`, or into a row error.

Readers call `parse_record` for every record and `unreadable_row` for a JSONL line that is
not a JSON object at all; neither ever raises for bad data, so one bad row never stops a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.constraint_fields import constraint_override
from astrai_batch.io.openai_request import parse_openai_record
from astrai_batch.io.row_validation import (
    collect_overrides,
    kept_values,
    row_id_for,
    validate_content,
)
from astrai_batch.io.rows import OVERRIDE_FIELDS, InputRow, RowPlan, RowProblem


def parse_record(record: Mapping[str, Any], index: int, plan: RowPlan) -> InputRow:
    """The row for `record`; problems with the record become `InputRow.error`."""
    kept = kept_values(record, plan)
    if plan.shape == "openai":
        return parse_openai_record(record, index, plan, kept)
    row_id = row_id_for(record, index, plan)
    try:
        content = validate_content(plan.shape, record.get(plan.prompt_field), plan.shape)
        constraint = constraint_override(record)
    except RowProblem as problem:
        return InputRow(index=index, id=row_id, kept=kept, error=str(problem))
    return InputRow(
        index=index,
        id=row_id,
        overrides={**collect_overrides(record, OVERRIDE_FIELDS), **constraint},
        kept=kept,
        **content,
    )


def unreadable_row(index: int, message: str, plan: RowPlan) -> InputRow:
    """A row for a record that could not be read as an object (bad JSON, not an object)."""
    return InputRow(
        index=index, id=str(index), kept=dict.fromkeys(plan.keep_columns), error=message
    )
