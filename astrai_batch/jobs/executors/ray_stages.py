"""The functions Ray Data runs for a sharded job: read and key, summarize, route, generate.

Each stage is a plain function or a callable class over Arrow batches; the driver strings
them together in `ray_job` (this module never imports ray, so it is testable without it).
Rows travel between stages as a few columns Ray Data shuffles on (``group``, ``shard``) and
the prepared row itself, pickled (``row``): sampling parameters, kept input columns of any
Arrow type and token ids pass through unchanged, so a worker builds exactly the records a
local run would.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.errors import AstraiBatchError
from astrai_batch.io import InputSource
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.openai_options import served_names
from astrai_batch.jobs.planning.embed_rows import job_embed_request, read_matryoshka
from astrai_batch.jobs.planning.image_encoding import weightless_tower
from astrai_batch.jobs.planning.sharding import (
    GroupSummary,
    KeyedRow,
    Piece,
    ShardPlan,
    group_key,
    summarize_group,
)
from astrai_batch.jobs.planning.window import PreparedRow, prepare_window

KEYED_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64()),
        pa.field("group", pa.string()),  # null for rows that failed before planning
        pa.field("tokens", pa.list_(pa.int64())),
        pa.field("max_new", pa.int64()),
        pa.field("adapter", pa.string()),  # the row's LoRA adapter; null: the base model
        pa.field("row", pa.binary()),
        # an OpenAI line's body fields the job ignores: the driver warns once per name
        pa.field("ignored", pa.list_(pa.string())),
    ]
)
IGNORED_SCHEMA = pa.schema([pa.field("name", pa.string())])
SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("sort_key", pa.list_(pa.int64())),
        pa.field("first_index", pa.int64()),
        pa.field("rows", pa.int64()),
        pa.field("work", pa.int64()),
        pa.field("split_depth", pa.int64()),
        pa.field("pieces", pa.string()),  # JSON [[key, rows, work], ...]
        pa.field("adapter", pa.string()),
    ]
)
ROUTED_SCHEMA = pa.schema(
    [pa.field("index", pa.int64()), pa.field("shard", pa.int64()), pa.field("row", pa.binary())]
)


@dataclass(frozen=True)
class ChunkReader:
    """Stage 1 (a Ray Data task per chunk of rows): read rows [start, end) of the input with
    our own readers (the same parsing, ids and row errors as a local run), tokenize them with
    the model's tokenizer and key each row by its prefix group. `source` is the input the
    driver opened, with what its open scan recorded (Parquet row groups, JSONL row offsets,
    repeated ids) and its filesystem (endpoint, region): a task on any machine reads only
    its chunk's range of the same object, never the input from its start."""

    source: InputSource
    config: JobConfig
    chunk_rows: int
    model_name: str
    embed: EmbedRequest | None = None  # --task embed: the job's request (pooling resolved)
    vision: bool = False  # a vision-language model: rows' images are encoded here

    def __call__(self, batch: pa.Table) -> pa.Table:
        from astrai_batch.engine import load_tokenizer
        from astrai_batch.jobs.planning.tokenize import PromptEncoder

        config = self.config
        tokenizer, location = load_tokenizer(
            config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
        )
        # images as a local run encodes them (the processor, their keys and placeholders),
        # with the model's config and processor only: the workers load the weights
        tower = weightless_tower(location, config.trust_remote_code) if self.vision else None
        encoder = PromptEncoder(
            tokenizer,
            self.model_name,
            chat_template_kwargs=config.chat_template_kwargs,
            vision=tower,
            image_limits=config.image_limits(),
        )
        out: list[dict[str, Any]] = []
        for chunk in batch.column("id").to_pylist():
            start = int(chunk) * self.chunk_rows
            rows = list(self.source.iter_rows(start, start + self.chunk_rows))
            if not rows:
                continue
            window = prepare_window(
                int(chunk),
                start,
                rows,
                encoder=encoder,
                base_params=config.sampling,
                page_size=config.page_size,
                group_offset=0,
                grouping=config.grouping,
                adapters=tuple(name for name, _ in config.lora),
                embed=self.embed,
                served=served_names(config.model, self.model_name, config.served_model_name),
                tool_parser=config.tool_call_parser,
                line_embed=job_embed_request(config.pooling, config.normalize, None, config.model)
                if config.task == "generate"
                else None,
                matryoshka=read_matryoshka(config.model),
            )
            ignored = {row.index: list(row.ignored_fields) for row in rows}
            out.extend(
                {**keyed_record(row, config.page_size), "ignored": ignored[row.index]}
                for row in window.rows
            )
        return pa.Table.from_pylist(out, schema=KEYED_SCHEMA)


def ignored_names(batch: pa.Table) -> pa.Table:
    """The distinct ignored body field names of a batch of keyed rows (`map_batches`): the
    driver takes these few names, never the rows."""
    names = sorted({name for names in batch.column("ignored").to_pylist() for name in names or ()})
    return pa.Table.from_pylist([{"name": name} for name in names], schema=IGNORED_SCHEMA)


def keyed_record(row: PreparedRow, page_size: int) -> dict[str, Any]:
    runnable = row.token_ids is not None and row.params is not None
    return {
        "index": row.index,
        "group": group_key(row.index, row.token_ids, page_size, row.adapter)  # type: ignore[arg-type]
        if runnable
        else None,
        "tokens": list(row.token_ids) if runnable else None,  # type: ignore[arg-type]
        "max_new": work_after_prompt(row) if runnable else 0,
        "adapter": row.adapter,
        "row": pickle.dumps(dataclasses.replace(row, prefix_group=None)),
    }


def work_after_prompt(row: PreparedRow) -> int:
    """Tokens a runnable row computes beyond its prompt (a score row's prompt is its
    context, whose prefix groups shard it): a generation row's samples, a score row's
    continuation branches (each continuation's tokens but its last), an embedding none."""
    if row.embed is not None:
        return 0
    if row.continuations is not None:
        return sum(len(tokens) - 1 for tokens in row.continuations)
    return row.params.max_tokens * row.params.n  # type: ignore[union-attr]


def summarize_batch(group: pa.Table, *, page_size: int) -> pa.Table:
    """Stage 2 (Ray Data `map_groups` on ``group``): one summary row per prefix group."""
    keys = set(group.column("group").to_pylist())
    if keys == {None}:  # rows that failed before planning belong to no group
        return SUMMARY_SCHEMA.empty_table()
    if len(keys) != 1:
        raise AstraiBatchError(f"a prefix-group batch holds {len(keys)} groups")
    rows = [
        KeyedRow(index, tuple(tokens), max_new, adapter)
        for index, tokens, max_new, adapter in zip(
            group.column("index").to_pylist(),
            group.column("tokens").to_pylist(),
            group.column("max_new").to_pylist(),
            group.column("adapter").to_pylist(),
            strict=True,
        )
    ]
    summary = summarize_group(keys.pop(), rows, page_size)
    return pa.Table.from_pylist([summary_record(summary)], schema=SUMMARY_SCHEMA)


def summary_record(summary: GroupSummary) -> dict[str, Any]:
    return {
        "key": summary.key,
        "sort_key": list(summary.sort_key),
        "first_index": summary.first_index,
        "rows": summary.rows,
        "work": summary.work,
        "split_depth": summary.split_depth,
        "pieces": json.dumps([[p.key, p.rows, p.work] for p in summary.pieces]),
        "adapter": summary.adapter,
    }


def summary_from_record(record: dict[str, Any]) -> GroupSummary:
    return GroupSummary(
        key=record["key"],
        sort_key=tuple(record["sort_key"]),
        first_index=record["first_index"],
        rows=record["rows"],
        work=record["work"],
        split_depth=record["split_depth"],
        pieces=tuple(Piece(key, rows, work) for key, rows, work in json.loads(record["pieces"])),
        adapter=record["adapter"],
    )


@dataclass(frozen=True)
class Router:
    """Stage 3 (`map_batches`): give every row its shard and its global prefix-group number;
    drop rows of shards a previous run finished. Failed rows (no group) spread by index."""

    plan: ShardPlan
    skip_shards: frozenset[int]

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: list[dict[str, Any]] = []
        for index, key, tokens, payload in zip(
            batch.column("index").to_pylist(),
            batch.column("group").to_pylist(),
            batch.column("tokens").to_pylist(),
            batch.column("row").to_pylist(),
            strict=True,
        ):
            if key is None:
                shard, payload_out = index % self.plan.workers, payload
            else:
                shard = self.plan.route(key, tokens)
                row = pickle.loads(payload)
                numbered = dataclasses.replace(row, prefix_group=self.plan.group_numbers[key])
                payload_out = pickle.dumps(numbered)
            if shard not in self.skip_shards:
                out.append({"index": index, "shard": shard, "row": payload_out})
        return pa.Table.from_pylist(out, schema=ROUTED_SCHEMA)


def shard_rows(batch: pa.Table) -> tuple[int, list[PreparedRow]]:
    """The shard number and rows (input order) of one `map_groups` batch."""
    shards = set(batch.column("shard").to_pylist())
    if len(shards) != 1:
        raise AstraiBatchError(f"a shard batch holds rows of shards {sorted(shards)}")
    rows = [pickle.loads(payload) for payload in batch.column("row").to_pylist()]
    return shards.pop(), sorted(rows, key=lambda row: row.index)


def summaries_of(records: Sequence[dict[str, Any]]) -> list[GroupSummary]:
    return [summary_from_record(record) for record in records]
