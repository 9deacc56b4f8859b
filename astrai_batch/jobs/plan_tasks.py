"""`astrai-batch plan --task score|embed`: rows encoded as `run` encodes them for the task,
and the lines the report prints for each task.

A score row is its context's tokens (lm-eval's `_encode_pair`, `planning/score_pairs`) and
its continuations' tokens; an embed row is its prompt's tokens, with the OpenAI line's
`body.dimensions` checked against the job's as `run` does. Rows `run` would fail before
the model are bad rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.io import InputRow
from astrai_batch.jobs.planning.embed_rows import embed_row_problem, job_embed_request
from astrai_batch.jobs.planning.score_pairs import encode_pairs
from astrai_batch.jobs.planning.task_prefill import EmbedPrefill, ScorePrefill
from astrai_batch.jobs.planning.tokenize import PromptEncoder


@dataclass(frozen=True)
class PlannedRow:
    """A row's model input for the task (None: a bad row), and a score row's continuations."""

    row: InputRow
    token_ids: tuple[int, ...] | None
    continuations: tuple[tuple[int, ...], ...] = ()


def task_embed_request(
    task: str, pooling: str | None, dimensions: int | None, model_dir: str
) -> EmbedRequest | None:
    """The embed job's request, its pooling resolved as `run` resolves it."""
    if task != "embed":
        return None  # as in `run`, the embed options mean nothing to other tasks
    return job_embed_request(pooling, True, dimensions, model_dir)


def encode_for_task(
    encoder: PromptEncoder, batch: Sequence[InputRow], task: str, embed: EmbedRequest | None
) -> list[PlannedRow]:
    if task == "score":
        return [
            PlannedRow(row, pair.context, pair.continuations or ())
            for row, pair in zip(batch, encode_pairs(encoder, batch), strict=True)
        ]
    planned = []
    for row, encoding in zip(batch, encoder.encode(batch), strict=True):
        token_ids = encoding.token_ids
        if embed is not None and embed_row_problem(row.overrides, embed) is not None:
            token_ids = None
        planned.append(PlannedRow(row, token_ids))
    return planned


def score_lines(score: ScorePrefill) -> list[str]:
    contexts = score.contexts
    return [
        f"pairs                     {score.pairs:,} (context, continuation)",
        f"context tokens            {contexts.prompt_tokens:,}",
        f"reusable context tokens   {contexts.reusable_tokens:,} (page size {contexts.page_size})",
        f"continuation tokens       {score.continuation_tokens:,} "
        f"({score.branch_tokens:,} computed: each forks from its context, its last token unfed)",
        f"tokens to prefill         {score.predicted_prefill_tokens:,}",
        f"ideal prefill             {score.ideal_prefill_tokens:,} (each token of every pair's "
        f"input once): predicted {score.predicted_over_ideal:.3f}x",
        f"each pair alone           {score.pair_alone_tokens:,} (one forward per pair): "
        f"predicted saving {score.saving_over_pairs_alone:.1%}",
    ]


def embed_lines(embed: EmbedPrefill) -> list[str]:
    prompts = embed.prompts
    if embed.uses_prefix_cache:
        reuse = f"{prompts.reusable_tokens:,} (page size {prompts.page_size})"
    else:
        reuse = (
            f"0 ({embed.pooling} pooling computes every prompt token; last pooling would "
            f"reuse {prompts.reusable_tokens:,})"
        )
    return [
        f"prompt tokens             {prompts.prompt_tokens:,}",
        f"reusable tokens           {reuse}",
        f"tokens to prefill         {embed.predicted_prefill_tokens:,}",
        f"predicted prefill saving  {embed.predicted_prefill_saving:.1%}",
    ]
