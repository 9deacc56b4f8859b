"""OpenAI `/v1/embeddings` batch lines: the request's input in, the response body out.

In: ``body.input`` is one string or one list of token ids (a list of several inputs is a row
error: one line, one embedding); ``body.encoding_format`` must be ``float`` when given;
``body.dimensions`` must match the job's ``--dimensions`` (a Parquet column has one size);
``model`` and ``user`` are ignored. Out: ``{"object": "list", "data": [{"object":
"embedding", "index": 0, "embedding": [...]}], "model", "usage"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.row_validation import validate_prompt, validate_token_ids
from astrai_batch.io.rows import RowProblem

EMBEDDINGS_URL = "/v1/embeddings"
ACCEPTED = frozenset({"input", "model", "user", "encoding_format", "dimensions"})


def parse_embeddings_request(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's content keyword and its overrides ({"dimensions": N} when given)."""
    unknown = sorted(set(body) - ACCEPTED)
    if unknown:
        raise RowProblem(f"unsupported body field {unknown[0]!r}")
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        if len(value) != 1:
            raise RowProblem("body.input must be one input per line, got a list of texts")
        value = value[0]
    if isinstance(value, list):
        content = {"prompt_token_ids": validate_token_ids(value, "body.input")}
    else:
        content = {"prompt": validate_prompt(value, "body.input")}
    encoding = body.get("encoding_format")
    if encoding not in (None, "float"):
        raise RowProblem(f"body.encoding_format must be float, got {encoding!r}")
    overrides = {}
    if body.get("dimensions") is not None:
        overrides["dimensions"] = body["dimensions"]
    return content, overrides


def embeddings_response_body(
    model: str, embedding: list[float], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": list(embedding)}],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
