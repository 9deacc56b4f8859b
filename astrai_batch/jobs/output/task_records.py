"""The records of rows of tasks other than generation (see `records`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from astrai_batch.engine.types import GenerationResult


def score_record(row: Any, result: GenerationResult, base: dict[str, Any]) -> dict[str, Any]:
    """A `--task score` row's record: `base` (the row's error record, for its identity and
    kept columns) with the scores, one list entry per continuation."""
    scores = result.scores or ()
    return {
        **base,
        "finish_reason": result.finish_reason,
        "error": None,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "completion_tokens": 0,
        "loglikelihoods": [score.logprob for score in scores],
        "continuation_tokens": [score.num_tokens for score in scores],
        "is_greedy": [score.is_greedy for score in scores],
    }


def logprob_rows(entries, texts) -> list[dict[str, Any] | None] | None:
    """TokenLogprobs as rows of `io.schemas.TOKEN_LOGPROB_TYPE` (None stays None: the
    first prompt token has no logprob)."""
    if entries is None:
        return None
    texts = texts or {}
    return [
        None
        if entry is None
        else {
            "token": texts.get(entry.token_id),
            "token_id": entry.token_id,
            "logprob": entry.logprob,
            "rank": entry.rank,
            "top_logprobs": [
                {"token": texts.get(token), "token_id": token, "logprob": value}
                for token, value in entry.top
            ],
        }
        for entry in entries
    ]


def embed_record(result: GenerationResult, base: dict[str, Any]) -> dict[str, Any]:
    """A `--task embed` row's record: `base` (identity, kept columns) with its vector."""
    return {
        **base,
        "finish_reason": result.finish_reason,
        "error": None,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "completion_tokens": 0,
        "embedding": list(result.embedding or ()),
    }


def fixed_size_embedding(schema: pa.Schema, size: int) -> pa.Schema:
    """The output schema with its `embedding` column as fixed_size_list<float32>[size]."""
    position = schema.get_field_index("embedding")
    field = pa.field("embedding", pa.list_(pa.float32(), size))
    return schema.set(position, field)
