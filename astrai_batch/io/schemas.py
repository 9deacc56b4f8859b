"""The Arrow schemas of every file a job writes, spelled out so their layout is a contract.

Result files hold one row per (input row, sample). A failed input row gets a single row with
``sample_index`` 0, ``finish_reason`` "error", ``error`` set and null completion. ``id`` is
null only on a failed row whose input id is missing or repeats an earlier row's.
"""

from __future__ import annotations

import pyarrow as pa

from astrai_batch.errors import ConfigError

FINISH_REASONS = ("stop", "length", "error")

RESULT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("completion", pa.string()),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("prefix_group", pa.int64()),
        pa.field("error", pa.string()),
    ]
)

TOKEN_IDS_FIELD = pa.field("completion_token_ids", pa.list_(pa.int32()))
LOGPROBS_FIELD = pa.field("logprobs", pa.list_(pa.float32()))

# --task score: per continuation, in the row's order (lm-eval's loglikelihood answer)
SCORE_FIELDS = (
    pa.field("loglikelihoods", pa.list_(pa.float64())),
    pa.field("continuation_tokens", pa.list_(pa.int32())),
    pa.field("is_greedy", pa.list_(pa.bool_())),
)
# --task embed: the pooled vector (fixed_size_list<float32>[D] in the final output, D the
# model's hidden size or --dimensions; parts hold list<float32>)
EMBED_FIELDS = (pa.field("embedding", pa.list_(pa.float32())),)
TASK_FIELDS = {"score": SCORE_FIELDS, "embed": EMBED_FIELDS}

# top_logprobs (per generated token) and prompt_logprobs (per prompt token, the first null):
# the token, its logprob and rank (1 + tokens strictly likelier) and the N likeliest
ALTERNATIVE_TYPE = pa.struct(
    [("token", pa.string()), ("token_id", pa.int32()), ("logprob", pa.float64())]
)
TOKEN_LOGPROB_TYPE = pa.struct(
    [
        ("token", pa.string()),
        ("token_id", pa.int32()),
        ("logprob", pa.float64()),
        ("rank", pa.int32()),
        ("top_logprobs", pa.list_(ALTERNATIVE_TYPE)),
    ]
)
TOP_LOGPROBS_FIELD = pa.field("top_logprobs", pa.list_(TOKEN_LOGPROB_TYPE))
PROMPT_LOGPROBS_FIELD = pa.field("prompt_logprobs", pa.list_(TOKEN_LOGPROB_TYPE))
# An OpenAI chat line's tool calls (`io.openai_tools`): OpenAI's id, function name and
# arguments (JSON text); null when the sample holds none
TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
TOOL_CALLS_FIELD = pa.field("tool_calls", pa.list_(TOOL_CALL_TYPE))
# --reasoning-parser: the reasoning split from the completion (null: none)
REASONING_FIELD = pa.field("reasoning", pa.string())

# One row per stats window plus one total row (window null, is_total true).
STATS_SCHEMA = pa.schema(
    [
        pa.field("window", pa.int32()),
        pa.field("is_total", pa.bool_(), nullable=False),
        pa.field("rows", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("hit_rate", pa.float64()),
        pa.field("prefill_tokens_computed", pa.int64()),
        pa.field("decode_tokens", pa.int64()),
        pa.field("evicted_pages", pa.int64()),
        pa.field("preemptions", pa.int64()),
        pa.field("peak_kv_pages", pa.int64()),
        pa.field("wall_seconds", pa.float64()),
        pa.field("tokens_per_second", pa.float64()),
        pa.field("constrained_rows", pa.int64()),
        pa.field("grammars_compiled", pa.int64()),
        pa.field("grammar_compile_seconds", pa.float64()),
        pa.field("mask_fill_seconds", pa.float64()),
        # vision-language models: images run through the vision tower, encodes the encoder
        # cache saved, image placeholder tokens served from the prefix cache
        pa.field("images_encoded", pa.int64()),
        pa.field("image_encodes_saved", pa.int64()),
        pa.field("image_tokens_cached", pa.int64()),
    ]
)


def result_schema(
    save_tokens: bool,
    logprobs: bool,
    kept: pa.Schema | None,
    task: str = "generate",
    *,
    top_logprobs: bool = False,
    prompt_logprobs: bool = False,
    tool_calls: bool = False,
    reasoning: bool = False,
    embeddings: bool = False,
) -> pa.Schema:
    """RESULT_SCHEMA plus, in this order, token ids, logprobs, tool calls, reasoning, the
    task's columns and the kept input columns (with their input types, nullable because a
    failed row may lack them)."""
    fields = list(RESULT_SCHEMA)
    if save_tokens:
        fields.append(TOKEN_IDS_FIELD)
    if logprobs:
        fields.append(LOGPROBS_FIELD)
    if top_logprobs:
        fields.append(TOP_LOGPROBS_FIELD)
    if prompt_logprobs:
        fields.append(PROMPT_LOGPROBS_FIELD)
    if tool_calls:
        fields.append(TOOL_CALLS_FIELD)
    if reasoning:
        fields.append(REASONING_FIELD)
    if task == "all":  # checkpoint parts: every column any output format may read
        fields.extend(field for task_fields in TASK_FIELDS.values() for field in task_fields)
    else:
        fields.extend(TASK_FIELDS.get(task, ()))
        if embeddings and task == "generate":  # OpenAI embeddings lines in a generate job
            fields.extend(EMBED_FIELDS)
    for kept_field in kept or pa.schema([]):
        if kept_field.name in {field.name for field in fields}:
            raise ConfigError(
                f"keep column {kept_field.name!r} has the name of a result column; "
                "rename it in the input or leave it out of keep_columns"
            )
        fields.append(kept_field.with_nullable(True))
    return pa.schema(fields)
