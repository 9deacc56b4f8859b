"""`astrai-batch plan`: what prefix caching would save on an input, without running a model.

Only the tokenizer is loaded. Rows are encoded exactly as `run` encodes them (the same
`PromptEncoder`) and streamed into a `PrefixStatsBuilder`; rows that would fail in `run`
before reaching the model are counted and left out.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.engine import load_tokenizer
from astrai_batch.engine.model.support import no_chat_template_message
from astrai_batch.engine.sampling.constraints import Constraint
from astrai_batch.errors import ConfigError, UnsupportedModelError
from astrai_batch.io import InputRow, open_input
from astrai_batch.jobs.options.config import DEFAULT_MAX_TOKENS
from astrai_batch.jobs.options.task_options import TASKS, check_embed_options, task_prompt_column
from astrai_batch.jobs.plan_tasks import (
    embed_lines,
    encode_for_task,
    score_lines,
    task_embed_request,
)
from astrai_batch.jobs.planning.image_encoding import weightless_tower
from astrai_batch.jobs.planning.prefix_stats import PrefixStats, PrefixStatsBuilder
from astrai_batch.jobs.planning.shard_prediction import ShardPrediction, predict_shards
from astrai_batch.jobs.planning.sharding import KeyedRow
from astrai_batch.jobs.planning.task_prefill import EmbedPrefill, ScorePrefill, ScorePrefillBuilder
from astrai_batch.jobs.planning.tokenize import ENCODE_BATCH_ROWS, PromptEncoder
from astrai_batch.jobs.planning.window import read_window

PREVIEW_CHARS = 60


@dataclass(frozen=True)
class PlanReport:
    input: str
    shape: str
    model: str
    bad_rows: int
    stats: PrefixStats
    previews: tuple[str, ...]  # decoded preview of each top shared prefix
    constrained_rows: int = 0  # rows with their own output constraint
    distinct_constraints: int = 0  # grammars `run` would compile for them
    shards: ShardPrediction | None = None  # with --workers
    # rows naming a LoRA adapter (`lora`): each adapter's own prefix statistics, since the
    # cache never shares pages across adapters; the base model's rows under None
    adapters: dict[str | None, PrefixStats] | None = None
    task: str = "generate"
    # --task score: `stats` are the contexts' (`score` adds the continuations); --task
    # embed: `stats` are the prompts' sharing, `embed` what the pooling lets `run` reuse
    score: ScorePrefill | None = None
    embed: EmbedPrefill | None = None

    def to_dict(self) -> dict[str, Any]:
        stats = self.stats.to_dict()
        for prefix, preview in zip(stats["top_shared_prefixes"], self.previews, strict=True):
            prefix["tokens_saved"] = (prefix["num_rows"] - 1) * prefix["num_tokens"]
            prefix["preview"] = preview
        return {
            "input": self.input,
            "shape": self.shape,
            "model": self.model,
            "bad_rows": self.bad_rows,
            **stats,
            "constrained_rows": self.constrained_rows,
            "distinct_constraints": self.distinct_constraints,
            **({"shards": self.shards.to_dict()} if self.shards else {}),
            **({"adapters": self._adapter_dicts()} if self.adapters else {}),
            "task": self.task,
            **({"score": self.score.to_dict()} if self.score else {}),
            **({"embed": self.embed.to_dict()} if self.embed else {}),
        }

    def _adapter_dicts(self) -> list[dict[str, Any]]:
        return [
            {
                "adapter": name,
                "rows": stats.rows,
                "prompt_tokens": stats.prompt_tokens,
                "reusable_tokens": stats.reusable_tokens,
                "predicted_prefill_saving": stats.predicted_prefill_saving,
            }
            for name, stats in (self.adapters or {}).items()
        ]

    def _task_line(self) -> list[str]:
        if self.embed is not None:
            return [f"task                      embed ({self.embed.pooling} pooling)"]
        if self.score is not None:
            return ["task                      score"]
        return []

    def _reuse_lines(self) -> list[str]:
        if self.score is not None:
            return score_lines(self.score)
        if self.embed is not None:
            return embed_lines(self.embed)
        stats = self.stats
        return [
            f"prompt tokens             {stats.prompt_tokens:,}",
            f"reusable tokens           {stats.reusable_tokens:,} (page size {stats.page_size})",
            f"tokens to prefill         {stats.unique_tokens:,}",
            f"predicted prefill saving  {stats.predicted_prefill_saving:.1%}",
        ]

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def text(self) -> str:
        stats = self.stats
        lines = [
            f"input                     {self.input} ({self.shape} rows)",
            f"model                     {self.model} (tokenizer only)",
            *self._task_line(),
            f"rows                      {stats.rows:,}"
            + (f" (+{self.bad_rows:,} with errors, left out)" if self.bad_rows else ""),
            *self._reuse_lines(),
        ]
        if self.adapters:
            total = sum(s.prompt_tokens for s in self.adapters.values())
            reusable = sum(s.reusable_tokens for s in self.adapters.values())
            lines.append(
                f"with LoRA adapters        {reusable:,} reusable tokens, predicted saving "
                f"{reusable / total if total else 0.0:.1%} (no page shared across adapters)"
            )
            for entry in self._adapter_dicts():
                name = entry["adapter"] or "(base)"
                lines.append(
                    f"  {name:<23} {entry['rows']:,} rows, {entry['prompt_tokens']:,} prompt "
                    f"tokens, {entry['predicted_prefill_saving']:.1%} reusable"
                )
        if self.constrained_rows:
            lines.append(
                f"output constraints        {self.distinct_constraints:,} distinct"
                f" over {self.constrained_rows:,} rows (each compiled once)"
            )
        if self.shards is not None:
            shards = self.shards
            lines += [
                f"workers                   {shards.workers}",
                f"predicted hit rate        {shards.one_worker_hit_rate:.1%} on one worker, "
                f"{shards.prefix_aware_hit_rate:.1%} with prefix-aware shards, "
                f"{shards.input_order_hit_rate:.1%} with blocks in input order",
            ]
        if stats.top_shared_prefixes:
            lines.append("largest shared prefixes:")
            lines.append(f"  {'tokens':>8} {'rows':>8} {'saved':>10}  preview")
            for prefix, preview in zip(stats.top_shared_prefixes, self.previews, strict=True):
                lines.append(
                    f"  {prefix.num_tokens:>8,} {prefix.num_rows:>8,} "
                    f"{prefix.tokens_saved:>10,}  {_short(preview)}"
                )
        else:
            lines.append("largest shared prefixes: none (no two rows share a full page)")
        return "\n".join(lines)


def plan_input(
    input_path: str | os.PathLike[str],
    *,
    model: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    page_size: int = 16,
    top: int = 10,
    input_format: str | None = None,
    prompt_column: str | None = None,
    id_column: str | None = None,
    workers: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    task: str = "generate",
    pooling: str | None = None,
    dimensions: int | None = None,
) -> PlanReport:
    """The prefix statistics of INPUT; with `workers`, also the hit rates that prefix-aware
    shards and input-order blocks would give (this keeps every row's token ids in memory).
    `task`, `pooling`, `dimensions`: as for `run` (see `plan_tasks`)."""
    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    check_embed_options(pooling, True, dimensions)
    if workers is not None and task != "generate":
        raise ConfigError(f"--workers predicts Ray shards; --task {task} runs locally only")
    source = open_input(
        input_path,
        input_format=input_format,
        prompt_column=task_prompt_column(task, prompt_column),
        id_column=id_column,
        task=task,
    )
    builder = PrefixStatsBuilder(page_size, top)  # checks page_size and top before loading
    tokenizer, location = load_tokenizer(
        model, revision=revision, trust_remote_code=trust_remote_code
    )
    embed = task_embed_request(task, pooling, dimensions, location)
    scores = ScorePrefillBuilder(page_size, top) if task == "score" else None
    encoder = PromptEncoder(
        tokenizer,
        model,
        chat_template_kwargs=chat_template_kwargs,
        # a vision model's rows with images are planned as run plans them (config and
        # processor: placeholders and content ids), with no weights loaded
        vision=weightless_tower(location, trust_remote_code),
    )
    if source.shape == "messages" and not encoder.has_chat_template:
        raise UnsupportedModelError(no_chat_template_message(model))
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    bad_rows = 0
    constraints = ConstraintCounter()
    keyed: list[KeyedRow] = []
    by_adapter: dict[str | None, PrefixStatsBuilder] = {}
    for batch in _batches(source.iter_rows()):
        for planned in encode_for_task(encoder, batch, task, embed):
            row, token_ids = planned.row, planned.token_ids
            if token_ids is None:
                bad_rows += 1
            else:
                builder.add(token_ids)
                if scores is not None:
                    scores.add(token_ids, planned.continuations)
                adapter = by_adapter.get(row.lora)
                if adapter is None:
                    adapter = by_adapter[row.lora] = PrefixStatsBuilder(page_size, top)
                adapter.add(token_ids)
                constraints.add(row)
                if workers is not None:
                    keyed.append(KeyedRow(row.index, token_ids, DEFAULT_MAX_TOKENS, row.lora))
    stats = builder.result()
    previews = tuple(
        preview_text(tokenizer, prefix.preview_token_ids) for prefix in stats.top_shared_prefixes
    )
    return PlanReport(
        input=source.path.shown,
        shape=source.shape,
        model=model,
        bad_rows=bad_rows,
        stats=stats,
        previews=previews,
        constrained_rows=constraints.rows,
        distinct_constraints=len(constraints.digests),
        shards=predict_shards(keyed, workers, page_size) if workers is not None else None,
        adapters=(
            {name: part.result() for name, part in sorted(by_adapter.items(), key=_base_first)}
            if set(by_adapter) - {None}
            else None
        ),
        task=task,
        score=scores.result() if scores is not None else None,
        embed=EmbedPrefill(embed.pooling, stats) if embed is not None else None,
    )


def _base_first(item: tuple[str | None, Any]) -> tuple[bool, str]:
    return item[0] is not None, item[0] or ""


class ConstraintCounter:
    """Rows with a constraint and the distinct ones (by digest, as the engine caches them)."""

    def __init__(self) -> None:
        self.rows = 0
        self.digests: set[str] = set()

    def add(self, row: InputRow) -> None:
        spec = row.overrides.get("constraint")
        if spec is None:
            return
        self.rows += 1
        self.digests.add(Constraint.from_dict(spec).digest)


def _batches(rows: Iterator[InputRow]) -> Iterator[list[InputRow]]:
    while batch := read_window(rows, ENCODE_BATCH_ROWS):
        yield batch


def preview_text(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """A prefix's tokens as text; each run of an image's placeholders (content ids, negative)
    as ``<image: N tokens>``, which no tokenizer could decode."""
    pieces: list[str] = []
    for image, ids in itertools.groupby(token_ids, key=lambda t: t < 0):
        run = list(ids)
        pieces.append(f"<image: {len(run)} tokens>" if image else tokenizer.decode(run))
    return "".join(pieces)


def _short(text: str) -> str:
    """A one-line quoted preview, cut at PREVIEW_CHARS characters."""
    quoted = json.dumps(text, ensure_ascii=False)[1:-1]
    if len(quoted) > PREVIEW_CHARS:
        quoted = quoted[: PREVIEW_CHARS - 3] + "..."
    return f'"{quoted}"'
