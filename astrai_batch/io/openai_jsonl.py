"""Output in the OpenAI Batch API output-file format, for inputs given in its input format.

One line per request::

    {"id": "batch_req_<index>", "custom_id": ..., "error": null,
     "response": {"status_code": 200, "request_id": "req_<index>", "body": {...}}}

where the body is a ``chat.completion`` or ``text_completion`` object built by
`openai_response_body`, with one choice per sample. A failed request has
``"response": null, "error": {"code": ..., "message": ...}``, as the Batch API's
request-output object defines it. ``<index>`` is the input row index, so ids are stable
across resumed runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from astrai_batch.io.filesystems import AtomicObject, Location, as_location
from astrai_batch.io.openai_logprobs import (
    chat_logprobs,
    completion_top_logprobs,
    vllm_prompt_logprobs,
)

# kind -> (response object name, response id prefix), as OpenAI names them.
CHAT_NAMES = ("chat.completion", "chatcmpl")
COMPLETION_NAMES = ("text_completion", "cmpl")
SAMPLE_FINISH_REASONS = ("stop", "length")
# OpenAI reports tokens the model gave zero probability as -9999.0, not -inf (invalid JSON).
NEG_INF_LOGPROB = -9999.0


def openai_response_body(
    kind: str,
    model: str,
    samples: Sequence[Mapping[str, Any]],
    prompt_tokens: int,
    created: int,
    *,
    response_id: str | None = None,
    cached_tokens: int | None = None,
    prompt_logprobs: list | None = None,
) -> dict[str, Any]:
    """A chat.completion ("chat") or text_completion ("completion") response body.

    Each sample is a mapping with ``text`` (chat: None when the answer is all tool calls),
    ``finish_reason`` ("stop" | "length") and ``completion_tokens``, optionally
    ``tool_calls`` (``{id, name, arguments}``: chat's ``message.tool_calls``, and finish reason
    "tool_calls" for a sample that stopped) and ``reasoning`` (``reasoning_content``, as vLLM
    names it); with logprobs it also has ``logprobs`` (one float per generated
    token) and ``tokens`` (the decoded text of each token), and with alternatives
    ``top_logprobs`` (rows of `io.schemas.TOKEN_LOGPROB_TYPE`: chat's ``top_logprobs``
    lists, the Completions API's ``{token: logprob}`` objects). `response_id` defaults to a hash
    of the body's content; `cached_tokens` adds ``usage.prompt_tokens_details``. For text
    completions ``text_offset`` counts from the start of the completion, since the prompt
    is not echoed.
    """
    if kind not in ("chat", "completion"):
        raise ValueError(f"kind must be 'chat' or 'completion', got {kind!r}")
    if not samples:
        raise ValueError("samples must hold at least one sample")
    if prompt_tokens < 0:
        raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
    object_name, id_prefix = CHAT_NAMES if kind == "chat" else COMPLETION_NAMES
    choices = [_choice(kind, position, sample) for position, sample in enumerate(samples)]
    completion_tokens = sum(int(sample["completion_tokens"]) for sample in samples)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if response_id is None:
        content = json.dumps([model, created, choices, usage], sort_keys=True)
        response_id = f"{id_prefix}-{hashlib.sha256(content.encode()).hexdigest()[:24]}"
    body = {
        "id": response_id,
        "object": object_name,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
        "system_fingerprint": None,
    }
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = vllm_prompt_logprobs(prompt_logprobs)
    return body


def _choice(kind: str, position: int, sample: Mapping[str, Any]) -> dict[str, Any]:
    finish_reason = sample["finish_reason"]
    if finish_reason not in SAMPLE_FINISH_REASONS:
        raise ValueError(
            f"sample {position} finish_reason must be 'stop' or 'length', got {finish_reason!r}"
        )
    text = sample["text"]
    logprobs = _logprobs(kind, position, sample)
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        calls = sample.get("tool_calls")
        if calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in calls
            ]
            if finish_reason == "stop":
                finish_reason = "tool_calls"
        if sample.get("reasoning") is not None:
            message["reasoning_content"] = sample["reasoning"]
        return {
            "index": position,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    echo = sample.get("echo")
    if echo is not None:
        text = echo["text"] + (text or "")
        logprobs = echoed_logprobs(echo, logprobs)
    return {
        "index": position,
        "text": text or "",
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def echoed_logprobs(
    echo: Mapping[str, Any], generated: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The Completions shape with the prompt echoed: its tokens first (the first token's
    logprob and alternatives null, as OpenAI and vLLM write them), then the completion's.
    None when the line asked for no logprobs."""
    rows = echo.get("logprobs")
    if generated is None or rows is None:
        return generated
    tokens = [*echo["tokens"], *generated["tokens"]]
    values = [None if row is None else _json_logprob(row["logprob"], 0) for row in rows]
    top = None
    if generated["top_logprobs"] is not None:
        prompt_top = [None if row is None else completion_top_logprobs([row])[0] for row in rows]
        top = [*prompt_top, *generated["top_logprobs"]]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [*values, *generated["token_logprobs"]],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _logprobs(kind: str, position: int, sample: Mapping[str, Any]) -> dict[str, Any] | None:
    if kind == "chat" and sample.get("top_logprobs") is not None:
        return {"content": chat_logprobs(sample["top_logprobs"]), "refusal": None}
    values = sample.get("logprobs")
    if values is None:
        return None
    tokens = sample.get("tokens")
    if tokens is None or len(tokens) != len(values):
        raise ValueError(f"sample {position} needs one token string per logprob in 'tokens'")
    finite = [_json_logprob(value, position) for value in values]
    if kind == "chat":
        content = [
            {"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []}
            for token, value in zip(tokens, finite, strict=True)
        ]
        return {"content": content, "refusal": None}
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": finite,
        "top_logprobs": completion_top_logprobs(sample.get("top_logprobs")),
        "text_offset": offsets,
    }


def _json_logprob(value: float, position: int) -> float:
    value = float(value)
    if value == -math.inf:
        return NEG_INF_LOGPROB
    if not math.isfinite(value):
        raise ValueError(f"sample {position} has a logprob of {value}")
    return value


class OpenAIBatchWriter:
    """Writes OpenAI batch output lines to `path` (a local path or a `Location` on any
    filesystem) atomically (see `AtomicObject`)."""

    def __init__(self, path: str | os.PathLike[str] | Location, *, overwrite: bool = False) -> None:
        self._file = AtomicObject(as_location(path), overwrite=overwrite)
        self.lines_written = 0

    @property
    def path(self) -> Location:
        return self._file.target

    @property
    def state(self) -> str:
        return self._file.state

    def write_response(self, custom_id: str | None, body: Mapping[str, Any], *, index: int) -> None:
        """A successful request: status 200 with `body` (see `openai_response_body`)."""
        response = {"status_code": 200, "request_id": f"req_{index}", "body": dict(body)}
        self._write_line(index, custom_id, response, None)

    def write_error(self, custom_id: str | None, *, code: str, message: str, index: int) -> None:
        """A failed request, e.g. code "invalid_request" for a bad input row."""
        self._write_line(index, custom_id, None, {"code": code, "message": message})

    def commit(self) -> None:
        self._file.commit()

    def abort(self) -> None:
        self._file.abort()

    def check_invariants(self) -> None:
        self._file.check_invariants()

    def __enter__(self) -> OpenAIBatchWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._file.state == "open":
            self.commit()

    def _write_line(
        self,
        index: int,
        custom_id: str | None,
        response: dict[str, Any] | None,
        error: dict[str, str] | None,
    ) -> None:
        self._file.require_open()
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        line = {
            "id": f"batch_req_{index}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        }
        text = json.dumps(line, ensure_ascii=False, allow_nan=False)
        self._file.handle.write(text.encode("utf-8") + b"\n")
        self.lines_written += 1
