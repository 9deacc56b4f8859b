"""Token logprob rows (`io.schemas.TOKEN_LOGPROB_TYPE`) in the OpenAI and vLLM formats."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def chat_logprobs(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions' ``choices[i].logprobs.content``: per generated token its text,
    logprob, UTF-8 bytes and ``top_logprobs`` (each alternative the same, without rank)."""
    return [
        {
            **_token(row),
            "top_logprobs": [_token(alternative) for alternative in row["top_logprobs"] or ()],
        }
        for row in rows
    ]


def completion_top_logprobs(
    rows: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, float]] | None:
    """The Completions API's ``logprobs.top_logprobs``: per generated token an object from
    each of its N likeliest alternatives' text to its logprob (None without rows)."""
    if rows is None:
        return None
    return [
        {alternative["token"] or "": _finite(alternative["logprob"]) for alternative in top}
        for top in (row["top_logprobs"] or () for row in rows)
    ]


def vllm_prompt_logprobs(rows: Sequence[Mapping[str, Any] | None]) -> list[Any]:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or an object from token
    id (a string key, as JSON has) to ``{logprob, rank, decoded_token}``: the prompt token
    itself and its N likeliest alternatives (rank: 1 + tokens strictly likelier; an
    alternative's rank is its place in the top N)."""
    out: list[Any] = []
    for row in rows:
        if row is None:
            out.append(None)
            continue
        entry: dict[str, Any] = {}
        for place, alternative in enumerate(row["top_logprobs"] or (), start=1):
            entry[str(alternative["token_id"])] = _vllm(alternative, place)
        entry[str(row["token_id"])] = _vllm(row, row["rank"])
        out.append(entry)
    return out


def _token(row: Mapping[str, Any]) -> dict[str, Any]:
    text = row["token"] or ""
    return {"token": text, "logprob": _finite(row["logprob"]), "bytes": list(text.encode())}


def _vllm(row: Mapping[str, Any], rank: int) -> dict[str, Any]:
    return {"logprob": _finite(row["logprob"]), "rank": rank, "decoded_token": row["token"]}


def _finite(value: float) -> float:
    # JSON has no -Infinity; OpenAI writes -9999.0 for a token of probability zero
    return -9999.0 if value == -math.inf else float(value)
