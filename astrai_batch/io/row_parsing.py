"""Turn one stored record (a plain dict) into an `InputRow`, or into a row error.

Readers call `parse_record` for every record and `unreadable_row` for a JSONL line that is
not a JSON object at all; neither ever raises for bad data, so one bad row never stops a job.
The record's own fields decide its shape (`shape_detection.row_shape`) and its id
(`row_ids.row_identity`); an id problem is reported before any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.constraint_fields import constraint_override
from astrai_batch.io.image_cells import CellOrigin
from astrai_batch.io.image_parts import image_cell_refs, with_column_images
from astrai_batch.io.image_sources import too_many_images_message
from astrai_batch.io.openai_embeddings import parse_embeddings_request
from astrai_batch.io.openai_request import (
    EMBEDDINGS_URL,
    body_model,
    check_line,
    parse_openai_request,
    request_body,
)
from astrai_batch.io.row_ids import DuplicateIds, row_identity
from astrai_batch.io.row_validation import (
    collect_overrides,
    kept_values,
    validate_adapter_name,
    validate_content,
    validate_template_kwargs,
)
from astrai_batch.io.rows import (
    LORA_FIELD,
    OVERRIDE_FIELDS,
    TEMPLATE_KWARGS_FIELD,
    InputRow,
    RowPlan,
    RowProblem,
)
from astrai_batch.io.shape_detection import NO_SHAPE_MESSAGE, row_shape
from astrai_batch.io.task_fields import task_fields


def parse_record(
    record: Mapping[str, Any],
    index: int,
    plan: RowPlan,
    duplicates: DuplicateIds,
    origin: CellOrigin | None = None,
) -> InputRow:
    """The row for `record`; problems with the record become `InputRow.error`. `origin`:
    where a Parquet or Arrow record is stored (its image bytes' `ImageCell`s)."""
    kept = kept_values(record, plan)
    shape = row_shape(record, plan.prompt_column, plan.prompt_column_shape)
    if plan.id_column is not None:
        missing_name = plan.id_column
    else:
        missing_name = "custom_id" if shape == "openai" else "id"
    identity = row_identity(
        record,
        index,
        id_fields=plan.id_fields,
        has_ids=plan.has_ids,
        duplicates=duplicates,
        missing_name=missing_name,
    )
    ids = {"index": index, "id": identity.id, "custom_id": identity.custom_id, "kept": kept}
    adapter: dict[str, str | None] = {}
    ignored: tuple[str, ...] = ()
    extras: dict[str, Any] = {}  # an OpenAI line's tools, echo, embedding format
    try:
        if identity.error is not None:
            raise RowProblem(identity.error)
        if shape is None:
            raise RowProblem(NO_SHAPE_MESSAGE)
        if shape == "openai" and record.get("url") == EMBEDDINGS_URL:
            # the url decides: an embeddings line embeds in a generate job too
            check_line(record)
            if plan.task == "score":
                raise RowProblem(f"url {EMBEDDINGS_URL} runs with --task generate or embed")
            content, overrides, ignored = parse_embeddings_request(_body(record))
            encoding = _body(record).get("encoding_format")
            extras["embedding"] = "base64" if encoding == "base64" else "float"
            kwargs = None
            adapter["model"] = body_model(record)
        elif shape == "openai":
            request = parse_openai_request(record)
            content, overrides = request.content, request.overrides
            kwargs, ignored = request.chat_template_kwargs, request.ignored_fields
            if request.tools is not None:
                extras |= {"tools": request.tools.tools, "tool_choice": request.tools.mode}
            if request.echo is not None:
                extras["echo"] = request.echo
            if request.best_of is not None:
                extras["best_of"] = request.best_of
            adapter["model"] = body_model(record)
        else:
            field_name = plan.prompt_column or shape
            content = validate_content(
                shape, record.get(field_name), field_name, empty_text=plan.task == "score"
            )
            overrides = collect_overrides(record, OVERRIDE_FIELDS) | constraint_override(record)
            kwargs = validate_template_kwargs(
                record.get(TEMPLATE_KWARGS_FIELD), TEMPLATE_KWARGS_FIELD
            )
            adapter["lora"] = validate_adapter_name(record.get(LORA_FIELD), LORA_FIELD)
        if plan.image_column is not None:
            column = plan.image_column
            if shape == "openai":
                if image_cell_refs(record.get(column), column):
                    raise RowProblem(
                        f"{column} holds images, but an OpenAI line names its images as "
                        "image_url parts of its messages"
                    )
            else:
                images = image_cell_refs(record.get(column), column, origin)
                content = with_column_images(shape, content, images, column)
        count = len(content.get("images", ()))
        if count > plan.max_images_per_row:
            raise RowProblem(too_many_images_message(count, plan.max_images_per_row))
        continuations = task_fields(record, plan.task, shape)
    except RowProblem as problem:
        return InputRow(**ids, error=str(problem))
    if "messages" not in content:
        kwargs = None  # only a chat template reads them
    return InputRow(
        **ids,
        overrides=overrides,
        chat_template_kwargs=kwargs,
        continuations=continuations,
        ignored_fields=ignored,
        **extras,
        **adapter,
        **content,
    )


def _body(record: Mapping[str, Any]) -> Mapping[str, Any]:
    return request_body(record.get("body"))


def unreadable_row(index: int, message: str, plan: RowPlan) -> InputRow:
    """A row for a record that could not be read as an object (bad JSON, not an object).
    Its id is unknown: the row number where the input numbers its rows, else none."""
    return InputRow(
        index=index,
        id=None if plan.has_ids else str(index),
        kept=dict.fromkeys(plan.keep_columns),
        error=message,
    )
