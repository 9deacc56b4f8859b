"""Result records: the rows checkpoint parts hold, one per (input row, sample).

A part record has every column either output format needs, so the output format can differ
from the one a checkpoint was started with: the result columns of `io.schemas` (token ids and
logprobs always included), the kept input columns, and three internal columns with the input
index, the request kind (chat or completion) and the OpenAI ``custom_id`` (the row id for
inputs that are not OpenAI batch lines).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from astrai_batch.engine.types import GenerationResult
from astrai_batch.errors import AstraiBatchError
from astrai_batch.io import result_schema
from astrai_batch.io.rows import BestOf
from astrai_batch.jobs.output.response_parsing import ResponseParsing
from astrai_batch.jobs.output.task_records import embed_record, logprob_rows, score_record
from astrai_batch.jobs.planning.window import PreparedRow

INDEX_COLUMN = "__astrai_row_index"
KIND_COLUMN = "__astrai_kind"
CUSTOM_ID_COLUMN = "__astrai_custom_id"
# an OpenAI completions line with echo: its prompt's token ids (null otherwise)
ECHO_COLUMN = "__astrai_echo_prompt"
# an OpenAI embeddings line: its encoding_format, float or base64 (null otherwise)
EMBEDDING_FORMAT_COLUMN = "__astrai_embedding_format"
# an OpenAI line of several prompts: the record's prompt number (null: the line's only one);
# the response's usage counts each prompt's tokens once
PROMPT_COLUMN = "__astrai_prompt"
INTERNAL_FIELDS = (
    pa.field(INDEX_COLUMN, pa.int64(), nullable=False),
    pa.field(KIND_COLUMN, pa.string(), nullable=False),
    pa.field(CUSTOM_ID_COLUMN, pa.string()),
    pa.field(ECHO_COLUMN, pa.list_(pa.int32())),
    pa.field(EMBEDDING_FORMAT_COLUMN, pa.string()),
    pa.field(PROMPT_COLUMN, pa.int32()),
)


def part_schema(kept: pa.Schema, task: str = "generate") -> pa.Schema:
    """The schema of checkpoint parts for an input whose keep columns have `kept`'s types
    (every task's columns: the OpenAI writer reads one column list whatever the task)."""
    del task
    fields = result_schema(
        True,
        True,
        kept,
        "all",
        top_logprobs=True,
        prompt_logprobs=True,
        tool_calls=True,
        reasoning=True,
    )
    return pa.schema([*fields, *INTERNAL_FIELDS])


def output_schema(
    kept: pa.Schema,
    *,
    save_tokens: bool,
    logprobs: bool,
    task: str = "generate",
    top_logprobs: bool = False,
    prompt_logprobs: bool = False,
    tool_calls: bool = False,
    reasoning: bool = False,
    embeddings: bool = False,
) -> pa.Schema:
    """The schema of the final Parquet output (a subset of the part schema's columns);
    `embeddings`: a generate job's embeddings lines keep their vectors (any size)."""
    return result_schema(
        save_tokens,
        logprobs,
        kept,
        task,
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        tool_calls=tool_calls,
        reasoning=reasoning,
        embeddings=embeddings,
    )


def error_record(row: PreparedRow, message: str) -> dict[str, Any]:
    """The single record of a failed input row."""
    return {
        "id": row.id,
        "sample_index": 0,
        "completion": None,
        "finish_reason": "error",
        "prompt_tokens": None,
        "cached_tokens": None,
        "completion_tokens": None,
        "prefix_group": row.prefix_group,
        "error": message,
        "completion_token_ids": None,
        "logprobs": None,
        **row.kept,
        INDEX_COLUMN: row.index,
        KIND_COLUMN: row.kind,
        CUSTOM_ID_COLUMN: row.custom_id,
        EMBEDDING_FORMAT_COLUMN: row.embedding,
    }


def row_records(
    row: PreparedRow,
    samples: Sequence[GenerationResult],
    parsing: ResponseParsing | None = None,
) -> list[dict[str, Any]]:
    """The records of a finished row: one per sample, or one error record if any failed.

    The engine fails all samples of a request together (a prompt that can never fit), so a
    row is either wholly generated or wholly failed; a line of several prompts fails whole
    when one of its prompts does, naming it. A row with tools, or a job with a reasoning
    parser, has its text read by `parsing` (`response_parsing`): ``completion`` holds the
    content, beside ``tool_calls`` and ``reasoning``. Samples are numbered as OpenAI numbers
    choices: prompt p's sample s is ``p * n + s`` (n: after ``best_of``'s choice).
    """
    if len(samples) != row.num_samples:
        raise AstraiBatchError(
            f"row {row.index} has {len(samples)} samples, expected {row.num_samples}"
        )
    failed = next((sample for sample in samples if sample.finish_reason == "error"), None)
    if failed is not None:
        message = failed.error or "generation failed"
        if row.num_prompts > 1:
            message = f"prompt {failed.sample_index // (row.num_samples // row.num_prompts)}: "
            message += failed.error or "generation failed"
        return [error_record(row, message)]
    if samples[0].scores is not None:
        return [score_record(row, samples[0], error_record(row, ""))]
    several = row.num_prompts > 1
    if samples[0].embedding is not None:
        return [
            {**embed_record(sample, error_record(row, "")), "sample_index": prompt}
            | ({PROMPT_COLUMN: prompt} if several else {})
            for prompt, sample in enumerate(sorted(samples, key=lambda s: s.sample_index))
        ]
    per_prompt = row.num_samples // row.num_prompts
    ordered = sorted(samples, key=lambda s: s.sample_index)
    out: list[dict[str, Any]] = []
    for prompt in range(row.num_prompts):
        group = ordered[prompt * per_prompt : (prompt + 1) * per_prompt]
        if row.best_of is not None:
            kept = best_samples(group, row.best_of)
            group = [
                dataclasses.replace(s, sample_index=prompt * len(kept) + s.sample_index)
                for s in kept
            ]
        out.extend(
            _sample_record(row, sample, parsing, prompt if several else None) for sample in group
        )
    return out


def _sample_record(
    row: PreparedRow,
    sample: GenerationResult,
    parsing: ResponseParsing | None,
    prompt: int | None,
) -> dict[str, Any]:
    return {
        "id": row.id,
        "sample_index": sample.sample_index,
        "completion": sample.text,
        **_parsed(row, sample, parsing),
        "finish_reason": sample.finish_reason,
        "prompt_tokens": sample.prompt_tokens,
        "cached_tokens": sample.cached_tokens,
        "completion_tokens": sample.completion_tokens,
        "prefix_group": row.prefix_group,
        "error": None,
        "completion_token_ids": list(sample.token_ids),
        "logprobs": None if sample.logprobs is None else list(sample.logprobs),
        "top_logprobs": logprob_rows(sample.top_logprobs, sample.token_texts),
        "prompt_logprobs": logprob_rows(sample.prompt_logprobs, sample.token_texts),
        **row.kept,
        INDEX_COLUMN: row.index,
        KIND_COLUMN: row.kind,
        CUSTOM_ID_COLUMN: row.custom_id,
        **({} if prompt is None else {PROMPT_COLUMN: prompt}),
        **_echo(row, sample, prompt or 0),
    }


def best_samples(samples: Sequence[GenerationResult], best: BestOf) -> list[GenerationResult]:
    """Completions' ``best_of``: the `best.keep` likeliest samples (the sum of their tokens'
    logprobs; the lower sample index first on a tie), numbered 0.. in that order, their
    logprobs kept only when the line asked for them."""
    ranked = sorted(samples, key=lambda s: (-math.fsum(s.logprobs or ()), s.sample_index))
    return [
        dataclasses.replace(
            sample,
            sample_index=place,
            logprobs=sample.logprobs if best.logprobs else None,
        )
        for place, sample in enumerate(ranked[: best.keep])
    ]


def _echo(row: PreparedRow, sample: GenerationResult, prompt: int) -> dict[str, Any]:
    """An echo row's prompt ids (the sample's prompt's); with max_tokens 0 (echo "prompt")
    the one token generated to get there is left out, so the row answers the prompt alone."""
    if row.echo is None:
        return {}
    out: dict[str, Any] = {ECHO_COLUMN: list(row.prompt_ids(prompt))}
    if row.echo == "prompt":
        out |= {"completion": "", "completion_tokens": 0, "completion_token_ids": []}
        out |= {"finish_reason": "length"}
        if sample.logprobs is not None:
            out["logprobs"] = []
        if sample.top_logprobs is not None:
            out["top_logprobs"] = []
    return out


def _parsed(
    row: PreparedRow, sample: GenerationResult, parsing: ResponseParsing | None
) -> dict[str, Any]:
    parsing = parsing or ResponseParsing()
    if row.tool_choice is None and parsing.reasoning_parser is None:
        return {}
    key = f"{row.id}\0{sample.sample_index}"
    parsed = parsing.parse(sample.text, sample.token_ids, row.tool_choice, key)
    return {
        "completion": parsed.content,
        "reasoning": parsed.reasoning,
        "tool_calls": parsed.tool_calls,
    }


def records_table(records: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Records as a table of the part schema."""
    try:
        return pa.Table.from_pylist(records, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise AstraiBatchError(f"result records do not fit the part schema: {exc}") from exc
