"""OpenAI `/v1/embeddings` batch lines: the request's input in, the response body out.

In: ``body.input`` is one string or one list of token ids (a list of several inputs is a row
error: one line, one embedding); ``body.encoding_format`` must be ``float`` when given;
``body.dimensions`` must match the job's ``--dimensions`` (a Parquet column has one size);
``model`` picks the model as on every line; the rest is `openai_fields`' table.
Out: ``{"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...]}],
"model", "usage"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.openai_fields import check_body_fields
from astrai_batch.io.row_validation import validate_prompt, validate_token_ids
from astrai_batch.io.rows import RowProblem


def parse_embeddings_request(
    body: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    """The row's content keyword, its overrides ({"dimensions": N} when given) and its
    ignored body fields (`openai_fields`)."""
    ignored = check_body_fields(body, "embedding")
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        if len(value) != 1:
            raise RowProblem("body.input must be one input per line, got a list of texts")
        value = value[0]
    if isinstance(value, list):
        content = {"prompt_token_ids": validate_token_ids(value, "body.input")}
    else:
        content = {"prompt": validate_prompt(value, "body.input")}
    overrides = {}
    if body.get("dimensions") is not None:
        overrides["dimensions"] = body["dimensions"]
    return content, overrides, ignored


def embeddings_response_body(
    model: str, embedding: list[float], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": list(embedding)}],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
