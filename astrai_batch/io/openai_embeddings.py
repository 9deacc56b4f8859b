"""OpenAI `/v1/embeddings` batch lines: the request's input in, the response body out.

In: ``body.input`` is one string or one list of token ids (a list of several inputs is a row
error: one line, one embedding); ``body.encoding_format`` is ``float`` or ``base64``;
``body.dimensions`` truncates (with ``--task embed`` it must be the job's ``--dimensions``:
a Parquet column has one size); ``model`` picks the model as on every line; the rest is
`openai_fields`' table. The url decides: an embeddings line embeds in a ``--task generate``
job too. Out: ``{"object": "list", "data": [{"object": "embedding", "index": 0,
"embedding": [...] or base64 text}], "model", "usage"}``.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.openai_fields import check_body_fields
from astrai_batch.io.row_validation import validate_prompt, validate_token_ids
from astrai_batch.io.rows import RowProblem
from astrai_batch.json_types import json_type


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
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise RowProblem(f"body.encoding_format must be float or base64, got {_shown(encoding)}")
    overrides = {}
    if body.get("dimensions") is not None:
        overrides["dimensions"] = body["dimensions"]
    return content, overrides, ignored


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_type(value)


def embeddings_response_body(
    model: str, embedding: list[float], prompt_tokens: int, encoding: str = "float"
) -> dict[str, Any]:
    """The response body; with ``base64`` the vector is the base64 text of its float32
    values, little-endian (what OpenAI writes and its client decodes)."""
    vector: Any = list(embedding)
    if encoding == "base64":
        vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": vector}],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
