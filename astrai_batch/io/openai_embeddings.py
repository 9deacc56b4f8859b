"""OpenAI `/v1/embeddings` batch lines: the request's input in, the response body out.

In: ``body.input`` is a string, a list of token ids, a list of strings or a list of
token-id lists (each input its own engine request, one embedding each, in order);
``body.encoding_format`` is ``float`` or ``base64``; ``body.dimensions`` truncates (with
``--task embed`` it must be the job's ``--dimensions``: a Parquet column has one size);
``model`` picks the model as on every line; the rest is `openai_fields`' table. The url
decides: an embeddings line embeds in a ``--task generate`` job too. Out: ``{"object":
"list", "data": [{"object": "embedding", "index": i, "embedding": [...] or base64 text}],
"model", "usage"}``, ``data[i]`` for ``input[i]``.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

from astrai_batch.io.openai_fields import check_body_fields
from astrai_batch.io.openai_request import completion_prompt
from astrai_batch.io.rows import RowProblem
from astrai_batch.json_types import json_type


def parse_embeddings_request(
    body: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    """The row's content keyword, its overrides ({"dimensions": N} when given) and its
    ignored body fields (`openai_fields`)."""
    ignored = check_body_fields(body, "embedding")
    content = completion_prompt(body.get("input"), "body.input")
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
    model: str, embeddings: list[list[float]], prompt_tokens: int, encoding: str = "float"
) -> dict[str, Any]:
    """The response body: one ``data`` entry per input, ``index`` its place in
    ``body.input``; `prompt_tokens` is every input's. With ``base64`` a vector is the base64
    text of its float32 values, little-endian (what OpenAI writes and its client decodes)."""
    data = []
    for index, embedding in enumerate(embeddings):
        vector: Any = list(embedding)
        if encoding == "base64":
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
