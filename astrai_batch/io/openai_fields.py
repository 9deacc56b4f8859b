"""The field table of OpenAI request bodies: what a batch job does with each field.

Every request field of OpenAI's API reference for chat completions, completions and
embeddings, plus the sampling extensions vLLM accepts, has one outcome here:

- ``honoured``: the field changes the row's result exactly as the API describes;
- ``ignored``: the field cannot change what a local batch job generates (billing, storage,
  OpenAI-side caching or moderation); the row runs and the job warns once per field name;
- ``refused``: the job cannot honour the field, so the row is an error saying why, unless
  the value is one of the field's ``neutral`` values (those that ask for nothing beyond
  plain generation, such as ``stream: false``), which are accepted silently.

A field absent from the table is refused (``body field 'x' is not a field of ...``).
docs/openai.md is this table in prose; tests/io/test_openai_fields.py walks it, and checks
that it names every field of the `openai` package's own request types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astrai_batch.io.rows import RowProblem

OUTCOMES = ("honoured", "ignored", "refused")


@dataclass(frozen=True)
class BodyField:
    """One row of the table. `note`: how the field is honoured, or why it is ignored or
    refused (the refusal's row error ends with it). `neutral`: values (canonical JSON) a
    refused field is accepted at."""

    outcome: str
    note: str
    neutral: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.neutral and self.outcome != "refused":
            raise ValueError("only a refused field has neutral values")


def canonical_json(value: Any) -> str:
    # JSON text keeps `false` apart from `0` and `[]` apart from `{}`
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def honoured(note: str) -> BodyField:
    return BodyField("honoured", note)


def ignored(note: str) -> BodyField:
    return BodyField("ignored", note)


def refused(note: str, *neutral: Any) -> BodyField:
    return BodyField("refused", note, frozenset(canonical_json(value) for value in neutral))


_SAMPLING = {
    "model": honoured(
        "the base model's name, a --served-model-name alias or a loaded LoRA adapter's name "
        "(the adapter runs the line); any other name is a row error"
    ),
    "max_tokens": honoured("the most tokens generated"),
    "n": honoured("samples per line, one choice each"),
    "temperature": honoured("sampling temperature (0: greedy)"),
    "top_p": honoured("nucleus sampling"),
    "seed": honoured("the row's sampling seed"),
    "stop": honoured("stop strings, left out of the text"),
    "presence_penalty": honoured("as OpenAI defines it"),
    "frequency_penalty": honoured("as OpenAI defines it"),
    "logit_bias": honoured(
        "token id -> bias in [-100, 100], added to the logits before penalties and "
        "constraints (a constraint's forbidden tokens stay forbidden)"
    ),
    "user": ignored("an end-user tag for OpenAI's abuse monitoring"),
    "stream": refused(
        "a batch job writes each response whole, never as a stream (give false or leave it out)",
        False,
    ),
    "stream_options": ignored("options of a stream, and a batch job never streams"),
    # vLLM's extensions of the request body, honoured as vLLM honours them
    "top_k": honoured("vLLM extension: top-k sampling"),
    "min_p": honoured("vLLM extension: min-p sampling"),
    "min_tokens": honoured("vLLM extension: no stop before this many tokens"),
    "repetition_penalty": honoured("vLLM extension: as transformers defines it"),
    "stop_token_ids": honoured("vLLM extension: token ids that end the output"),
    "ignore_eos": honoured("vLLM extension: generate past the end-of-sequence token"),
    "prompt_logprobs": honoured("vLLM extension: logprobs of the prompt's tokens"),
}

CHAT_FIELDS: dict[str, BodyField] = {
    **_SAMPLING,
    "messages": honoured(
        "the conversation, rendered by the model's chat template; image_url parts (data URLs, "
        "paths, s3:// / gs:// / file:// URIs; detail accepted) are the row's images"
    ),
    "max_completion_tokens": honoured("the newer name of max_tokens; wins over it"),
    "logprobs": honoured("each generated token's logprob in choices[].logprobs.content"),
    "top_logprobs": honoured("the N likeliest alternatives of each generated token"),
    "response_format": honoured("json_object or json_schema: a constrained output"),
    "reasoning_effort": honoured("a chat template variable (gpt-oss's template reads it)"),
    "chat_template_kwargs": honoured("vLLM extension: variables for the chat template"),
    "tools": honoured("function tools, given to the chat template"),
    "tool_choice": honoured(
        "none, auto (calls read by --tool-call-parser), required or a named function (a "
        "constrained output); answers in message.tool_calls"
    ),
    "functions": honoured("the legacy form of tools"),
    "function_call": honoured("the legacy form of tool_choice (none, auto or a name)"),
    "parallel_tool_calls": ignored(
        "required and auto return every call the output holds; a named function, one"
    ),
    "audio": refused("the runner generates text only, never audio"),
    "modalities": refused("the runner generates text only", ["text"]),
    "web_search_options": refused("a batch job has no web search"),
    "prediction": ignored("a predicted output only speeds up OpenAI's decoding"),
    "verbosity": ignored("steers OpenAI's own models only"),
    "store": ignored("storing completions is OpenAI's service"),
    "metadata": ignored("tags for OpenAI's stored completions"),
    "service_tier": ignored("OpenAI's processing tier"),
    "safety_identifier": ignored("an end-user tag for OpenAI's abuse monitoring"),
    "prompt_cache_key": ignored("OpenAI's cache routing; the prefix cache here is automatic"),
    "prompt_cache_retention": ignored("OpenAI's cache policy"),
    "prompt_cache_options": ignored("OpenAI's cache policy"),
    "moderation": ignored("moderation runs on OpenAI's side"),
}

COMPLETION_FIELDS: dict[str, BodyField] = {
    **_SAMPLING,
    "prompt": honoured(
        "a string, a list of token ids, or a list holding one of them (no images: those go "
        "in chat messages)"
    ),
    "logprobs": honoured(
        "an integer 0-5: each generated token's logprob and its N likeliest alternatives, "
        "in the Completions shape (true: the same as 0)"
    ),
    "echo": honoured(
        "the prompt (and with logprobs its tokens' logprobs, the first null) before the "
        "completion; with max_tokens 0 the prompt alone"
    ),
    "best_of": honoured(
        "generates best_of samples and returns the n likeliest (sum of token logprobs)"
    ),
    "suffix": refused(
        "inserting between a prompt and a suffix needs a fill-in-the-middle model", ""
    ),
}

EMBEDDING_FIELDS: dict[str, BodyField] = {
    "input": honoured("a string or a list of token ids"),
    "model": _SAMPLING["model"],
    "dimensions": honoured(
        "truncation to the first N values, then unit norm; with --task embed it must be the "
        "job's --dimensions (one column size)"
    ),
    "encoding_format": honoured(
        "float (a list of numbers) or base64 (the little-endian float32 bytes, as OpenAI)"
    ),
    "user": _SAMPLING["user"],
}

TABLES: dict[str, dict[str, BodyField]] = {
    "chat": CHAT_FIELDS,
    "completion": COMPLETION_FIELDS,
    "embedding": EMBEDDING_FIELDS,
}
URLS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
}


def check_body_fields(body: Mapping[str, Any], kind: str) -> tuple[str, ...]:
    """The names of `body`'s ignored fields, in name order; raises RowProblem for the
    first field (by name) the table refuses or lacks. Null values count as absent."""
    table = TABLES[kind]
    ignored_names = []
    for name in sorted(body):
        value = body[name]
        if value is None:
            continue
        rule = table.get(name)
        if rule is None:
            raise RowProblem(f"body field {name!r} is not a field of {URLS[kind]} requests")
        if rule.outcome == "ignored":
            ignored_names.append(name)
        elif rule.outcome == "refused" and canonical_json(value) not in rule.neutral:
            raise RowProblem(f"body.{name} cannot be honoured: {rule.note}")
    return tuple(ignored_names)


def ignored_field_warning(name: str) -> str:
    """The job's one warning for an ignored field (of any table)."""
    rule = next(table[name] for table in TABLES.values() if name in table)
    return f"warning: body field {name!r} is ignored: {rule.note}"
