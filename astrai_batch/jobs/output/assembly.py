"""The final files, assembled from a complete checkpoint: output, then stats.

Parts hold a window's records in the order they finished; each window is sorted back into
input order (row index, then sample index) on the way out, so memory is bounded by one window
of results. Both files are written atomically, on any filesystem (`io.filesystems`); the
output is committed last, so a visible output always has its stats file beside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch import __version__
from astrai_batch.errors import OutputError
from astrai_batch.io import OpenAIBatchWriter, openai_response_body
from astrai_batch.io.filesystems import Location, write_table_at
from astrai_batch.io.openai_embeddings import embeddings_response_body
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.lora_stats import SOURCE_COLUMNS, adapter_counts, with_adapter_rows
from astrai_batch.jobs.output.records import (
    CUSTOM_ID_COLUMN,
    ECHO_COLUMN,
    EMBEDDING_FORMAT_COLUMN,
    INDEX_COLUMN,
    KIND_COLUMN,
    PROMPT_COLUMN,
)
from astrai_batch.jobs.output.run_lock import process_alive
from astrai_batch.jobs.output.stats import stats_table
from astrai_batch.jobs.output.timeline import TIMELINE_KEY

ROW_GROUP_ROWS = 10_000
RUN_ID_KEY = "astrai_batch.run_id"


def stats_path_for(output: Path) -> Path:
    """``out.parquet`` -> ``out.stats.parquet``; ``out.jsonl`` -> ``out.stats.parquet``."""
    name = output.name
    for suffix in (".parquet", ".jsonl"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return output.with_name(f"{name}.stats.parquet")


def stats_location(output: Location) -> Location:
    """`stats_path_for` on any filesystem."""
    return output.sibling(stats_path_for(PurePosixPath(output.path)).name)


def output_metadata(
    *,
    config: Mapping[str, Any],
    model: Mapping[str, Any],
    input_fingerprint: Mapping[str, Any],
    run_id: str,
) -> dict[str, str]:
    """Parquet key-value metadata: the job's configuration, model, version and input."""
    return {
        "astrai_batch.version": __version__,
        "astrai_batch.config": json.dumps(dict(config), sort_keys=True),
        "astrai_batch.model": json.dumps(dict(model), sort_keys=True),
        "astrai_batch.input": json.dumps(dict(input_fingerprint), sort_keys=True),
        RUN_ID_KEY: run_id,
    }


def write_parquet_stream(
    output: Any, tables: Iterable[pa.Table], schema: pa.Schema, metadata: Mapping[str, str]
) -> int:
    """Tables (in input order) into an open atomic `output` (`handle`, `commit`, `abort`),
    committed at the end; returns the row count."""
    stamped = schema.with_metadata({**(schema.metadata or {}), **metadata})
    rows = 0
    try:
        with pq.ParquetWriter(output.handle, stamped) as writer:
            for table in tables:
                writer.write_table(table.cast(stamped), row_group_size=ROW_GROUP_ROWS)
                rows += table.num_rows
    except BaseException:
        output.abort()
        raise
    output.commit()
    return rows


OPENAI_COLUMNS = [
    "id",
    "sample_index",
    "completion",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "error",
    "completion_token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "tool_calls",
    "reasoning",
    "embedding",
    INDEX_COLUMN,
    KIND_COLUMN,
    CUSTOM_ID_COLUMN,
    ECHO_COLUMN,
    EMBEDDING_FORMAT_COLUMN,
    PROMPT_COLUMN,
]


def write_openai_tables(
    tables: Iterable[pa.Table],
    target: Location,
    *,
    model_name: str,
    tokenizer: Any,
    overwrite: bool,
    created: int,
) -> int:
    """OpenAI Batch output lines from tables of `OPENAI_COLUMNS` in input order."""
    with OpenAIBatchWriter(target, overwrite=overwrite) as writer:
        for table in tables:
            for records in _rows_of(table.to_pylist()):
                _write_openai_row(writer, records, model_name, tokenizer, created)
        return writer.lines_written


def _rows_of(records: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Consecutive records of the same input row (its samples)."""
    current: list[dict[str, Any]] = []
    for record in records:
        if current and record[INDEX_COLUMN] != current[0][INDEX_COLUMN]:
            yield current
            current = []
        current.append(record)
    if current:
        yield current


def _write_openai_row(
    writer: OpenAIBatchWriter,
    records: list[dict[str, Any]],
    model_name: str,
    tokenizer: Any,
    created: int,
) -> None:
    first = records[0]
    index = first[INDEX_COLUMN]
    custom_id = first[CUSTOM_ID_COLUMN]
    if first["finish_reason"] == "error":
        writer.write_error(custom_id, code="invalid_request", message=first["error"], index=index)
        return
    prompt_tokens, cached_tokens = _prompt_usage(records)
    if first.get("embedding") is not None:
        body = embeddings_response_body(
            model_name,
            [record["embedding"] for record in records],
            prompt_tokens,
            first.get(EMBEDDING_FORMAT_COLUMN) or "float",
        )
        writer.write_response(custom_id, body, index=index)
        return
    samples = []
    for record in records:
        sample: dict[str, Any] = {
            "text": record["completion"],
            "finish_reason": record["finish_reason"],
            "completion_tokens": record["completion_tokens"],
        }
        if record["logprobs"] is not None:
            sample["logprobs"] = record["logprobs"]
            sample["tokens"] = [tokenizer.decode([t]) for t in record["completion_token_ids"]]
        if record.get("top_logprobs") is not None:
            sample["top_logprobs"] = record["top_logprobs"]
        for name in ("tool_calls", "reasoning"):
            if record.get(name) is not None:
                sample[name] = record[name]
        if record.get(ECHO_COLUMN) is not None:
            sample["echo"] = echoed_prompt(record, tokenizer)
        samples.append(sample)
    body = openai_response_body(
        first[KIND_COLUMN],
        model_name,
        samples,
        prompt_tokens,
        created,
        cached_tokens=cached_tokens,
        # an echo row's prompt logprobs are in its choices' logprobs
        prompt_logprobs=None if first.get(ECHO_COLUMN) is not None else first["prompt_logprobs"],
    )
    writer.write_response(custom_id, body, index=index)


def _prompt_usage(records: list[dict[str, Any]]) -> tuple[int, int]:
    """A line's prompt and cached tokens: each of its prompts counted once (a line of
    several prompts has one record per prompt and sample, `PROMPT_COLUMN` telling them)."""
    first_of: dict[Any, dict[str, Any]] = {}
    for record in records:
        first_of.setdefault(record.get(PROMPT_COLUMN), record)
    prompt = sum(record["prompt_tokens"] or 0 for record in first_of.values())
    cached = sum(record["cached_tokens"] or 0 for record in first_of.values())
    return prompt, cached


def echoed_prompt(record: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    """An echo row's prompt for `openai_response_body`: its text, each token's text and, with
    logprobs, its tokens' logprob rows (the first null)."""
    ids = record[ECHO_COLUMN]
    return {
        "text": tokenizer.decode(ids),
        "tokens": [tokenizer.decode([token]) for token in ids],
        "logprobs": record.get("prompt_logprobs"),
    }


def write_stats(
    checkpoint: Checkpoint,
    target: Location,
    metadata: Mapping[str, str],
    adapters: Sequence[str] | None = None,
) -> None:
    """The stats file; always replaced, since it belongs to the output being written.
    With `adapters` (a LoRA job's names), one more row per adapter (`lora_stats`); a local
    run's time series in the metadata (`timeline`)."""
    table = stats_table(checkpoint.stats_by_window())
    if checkpoint.timeline is not None:
        metadata = {**metadata, TIMELINE_KEY: checkpoint.timeline.to_json()}
    if adapters is not None:
        table = with_adapter_rows(table, checkpoint_adapter_counts(checkpoint, adapters))
    try:
        write_table_at(target, table, metadata=metadata, overwrite=True)
    except OSError as exc:
        raise OutputError(f"cannot write {target.shown}: {exc.strerror or exc}") from exc


def checkpoint_adapter_counts(
    checkpoint: Checkpoint, adapters: Sequence[str]
) -> list[dict[str, Any]]:
    # counts need no order: every part as it is (a local run's windows, a Ray run's shards)
    tables = (path.read_parquet(SOURCE_COLUMNS) for path in checkpoint.part_paths())
    return adapter_counts(tables, adapters)


def remove_stale_temp_files(target: Location) -> list[str]:
    """Delete temporary files of `target` left by writers that were killed; returns their
    names.

    Locally `AtomicFile` names them ``.{name}.tmp-{pid}-{random}``; one whose process is
    gone can never be committed, and files of a live process are left alone. On an object
    store (``.{name}.tmp-{random}``: no process to ask) every one goes: the caller holds the
    output's run lock, and only a run holding it writes this output.
    """
    removed: list[str] = []
    prefix = f".{target.name}.tmp-"
    for name in target.parent.list_names():
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        stale = not target.is_local or (pid_text.isdigit() and not process_alive(int(pid_text)))
        if stale:
            target.sibling(name).delete()
            removed.append(name)
    return removed


def output_run_id(target: Location) -> str | None:
    """The run id stamped in a Parquet output's metadata, or None (not ours, not Parquet)."""
    try:
        stored = target.read_parquet_schema().metadata or {}
    except (OSError, pa.ArrowException):
        return None
    value = stored.get(RUN_ID_KEY.encode())
    return value.decode() if value is not None else None
