"""One grouping window: its rows tokenized, given their sampling parameters, and planned.

Windows are aligned on absolute row indices (window k holds rows k*W .. k*W + W - 1 for a
window of W rows), so a resumed job finds the same windows, plans them the same way and gives
every row the prefix group an uninterrupted run would have given it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.engine.request_checks import unknown_adapter_message
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.engine.tasks.scoring_types import ScoreRequest
from astrai_batch.engine.types import GenerationRequest, GenerationResult
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.io import InputRow
from astrai_batch.io.rows import BestOf
from astrai_batch.jobs.planning.embed_rows import Matryoshka, embed_row_problem
from astrai_batch.jobs.planning.prefix_order import plan_window
from astrai_batch.jobs.planning.score_pairs import score_encodings
from astrai_batch.jobs.planning.tokenize import PromptEncoder

LORA_COLUMN = "lora"  # the output column of a job with adapters
AUTO_TOOLS_MESSAGE = (
    "tool_choice auto (the default with tools) needs --tool-call-parser to read calls from "
    "the model's text; give one, or a tool_choice of required or a named function"
)


@dataclass(frozen=True, slots=True)
class PreparedRow:
    """A row ready to run (`token_ids` and `params` set) or failed (`error` set)."""

    index: int
    id: str | None  # None: the input row's id was missing or repeated (an error row)
    custom_id: str | None
    kind: str  # "chat" | "completion"
    kept: Mapping[str, Any]
    token_ids: tuple[int, ...] | None
    params: SamplingParams | None
    error: str | None
    prefix_group: int | None  # None for rows that failed before planning
    adapter: str | None = None  # the LoRA adapter the row runs with; None: the base model
    # --task score: each continuation's tokens (`token_ids` holds the context's)
    continuations: tuple[tuple[int, ...], ...] | None = None
    embed: EmbedRequest | None = None  # --task embed
    tool_choice: str | None = None  # an OpenAI chat line's (`io.openai_tools`)
    echo: str | None = None  # an OpenAI completions line's (`io.openai_request`)
    embedding: str | None = None  # an OpenAI embeddings line's encoding_format
    best_of: BestOf | None = None  # an OpenAI completions line's (`io.rows.BestOf`)
    # an OpenAI line's prompts after the first (`token_ids`): one engine request each
    extra_token_ids: tuple[tuple[int, ...], ...] = ()
    images: tuple = ()  # a vision-language model's images (`engine.vision.ImageInput`)

    def __post_init__(self) -> None:
        runnable = self.token_ids is not None and self.params is not None
        if runnable == (self.error is not None):
            raise ValueError(f"row {self.index}: either token_ids and params, or error")
        if self.extra_token_ids and (self.continuations is not None or not runnable):
            raise ValueError(f"row {self.index}: only a runnable OpenAI line has extra prompts")

    @property
    def num_prompts(self) -> int:
        """The engine requests of this row: one per prompt."""
        return 1 + len(self.extra_token_ids)

    @property
    def num_samples(self) -> int:
        """How many result samples the engine returns for this row (all its prompts')."""
        return self.params.n * self.num_prompts if self.params is not None else 0

    def prompt_ids(self, prompt: int) -> tuple[int, ...]:
        """The token ids of the row's prompt number `prompt` (0: `token_ids`)."""
        if prompt == 0:
            return self.token_ids or ()
        return self.extra_token_ids[prompt - 1]


@dataclass(frozen=True)
class PreparedWindow:
    """A window's rows in input order and the order in which the runnable ones execute.
    `rows` changes only by `release` (a finished row's images dropped)."""

    number: int
    start: int
    rows: list[PreparedRow]
    order: tuple[int, ...]  # positions in `rows` of runnable rows, in execution order
    group_offset: int
    num_groups: int

    def row(self, index: int) -> PreparedRow:
        """The row with absolute input index `index`."""
        position = index - self.start
        if not 0 <= position < len(self.rows):
            raise AstraiBatchError(f"row {index} is not in window {self.number}")
        return self.rows[position]

    def release(self, index: int) -> None:
        """Drop the images of row `index`, which has finished: what loads them again (a data
        URL's text, a path, a Parquet cell's place) is no longer needed, while the rest of
        the window, and the next window, may take long."""
        position = index - self.start
        row = self.rows[position]
        if row.images:
            self.rows[position] = dataclasses.replace(row, images=())

    def requests(self, skip: Collection[int] = ()) -> Iterator[GenerationRequest]:
        """The engine requests of runnable rows not in `skip`, in execution order."""
        for position in self.order:
            row = self.rows[position]
            if row.index in skip or row.token_ids is None or row.params is None:
                continue
            yield from row_requests(row)

    def check_invariants(self) -> None:
        indices = [row.index for row in self.rows]
        if indices != list(range(self.start, self.start + len(self.rows))):
            raise AstraiBatchError(
                f"window {self.number} rows are not consecutive from {self.start}"
            )
        runnable = [p for p, row in enumerate(self.rows) if row.error is None]
        if sorted(self.order) != runnable:
            raise AstraiBatchError(f"window {self.number} order does not cover its runnable rows")
        groups = {self.rows[p].prefix_group for p in runnable}
        if runnable and (
            min(groups) != self.group_offset
            or max(groups) != self.group_offset + self.num_groups - 1  # type: ignore[operator]
        ):
            raise AstraiBatchError(f"window {self.number} prefix groups are out of range")


def row_requests(row: PreparedRow) -> list[GenerationRequest]:
    """The engine requests of a runnable row, for every executor and task, one per prompt:
    seeded by the row id (the row number where the input has none), not its position, so a
    row keeps its samples when the input is split, sharded or reordered. The first prompt's
    request is the row's index, seeded by its id alone (a line's first prompt samples as it
    would alone); prompt p's is ``(index, p)``, seeded by ``(id, p)``."""
    if row.token_ids is None or row.params is None:
        raise AstraiBatchError(f"row {row.index} failed before planning: it has no request")
    score = None if row.continuations is None else ScoreRequest(row.continuations)
    return [
        GenerationRequest(
            row.index if prompt == 0 else (row.index, prompt),
            row.prompt_ids(prompt),
            row.params,
            seed_key=row.id if prompt == 0 else (row.id, prompt),
            score=score,
            embed=row.embed,
            adapter=row.adapter,
            images=row.images,
        )
        for prompt in range(row.num_prompts)
    ]


def request_row(request_id: Hashable) -> tuple[int, int]:
    """The input index and prompt number of a `row_requests` request id."""
    if isinstance(request_id, tuple):
        index, prompt = request_id
        return int(index), int(prompt)
    return int(request_id), 0  # type: ignore[call-overload]


def line_sample(row: PreparedRow, result: GenerationResult) -> GenerationResult:
    """A result as a sample of its row: prompt p's sample s is the row's sample
    ``p * n + s`` (OpenAI's and vLLM's choice index), under the row's request id, so a row
    of several prompts is complete, like a row of n samples, once all are in."""
    _, prompt = request_row(result.request_id)
    if prompt == 0:
        return result
    assert row.params is not None
    return dataclasses.replace(
        result,
        request_id=row.index,
        sample_index=prompt * row.params.n + result.sample_index,
    )


def row_adapter(row: InputRow, adapters: Sequence[str]) -> str | None:
    """The adapter a row asks for: its `lora` field, else an OpenAI line's body.model when
    it names one of the job's adapters (any other model name is the base model)."""
    if row.lora is not None:
        return row.lora
    if row.model is not None and row.model in adapters:
        return row.model
    return None


def unserved_model_message(
    row: InputRow, served: Sequence[str] | None, adapters: Sequence[str]
) -> str | None:
    """The row error of an OpenAI line whose body.model names neither the base model (one
    of `served`; None: no check) nor one of the job's adapters."""
    if served is None or row.model is None or row.model in served or row.model in adapters:
        return None
    listed = ", ".join(repr(name) for name in (*served, *adapters))
    return f"body.model {row.model!r} is not served by this job; it serves {listed}"


# An embeddings line in a generate job is one request of one sample, whatever --n says.
EMBED_LINE_PARAMS = SamplingParams(max_tokens=1)


def line_embedding(row: InputRow, line_embed: EmbedRequest | None) -> EmbedRequest | str:
    """The embedding request of a generate job's embeddings line, or its row error."""
    if line_embed is None:
        return "/v1/embeddings lines run with --task embed here"
    dims = row.overrides.get("dimensions")
    try:
        return dataclasses.replace(line_embed, dimensions=dims)
    except ValueError:
        return f"body.dimensions must be a positive integer, got {dims!r}"


def read_window(rows: Iterator[InputRow], size: int) -> list[InputRow]:
    """Up to `size` rows from the stream (fewer only at its end)."""
    return list(itertools.islice(rows, size))


def row_params(base: SamplingParams, overrides: Mapping[str, Any]) -> SamplingParams | str:
    """The row's sampling parameters, or the row error when an override is invalid."""
    if not overrides:
        return base
    try:
        return base.replace(**overrides)
    except ConfigError as exc:
        return f"invalid sampling parameters: {exc}"


def prepare_window(
    number: int,
    start: int,
    input_rows: list[InputRow],
    *,
    encoder: PromptEncoder,
    base_params: SamplingParams,
    page_size: int,
    group_offset: int,
    grouping: bool,
    adapters: Sequence[str] = (),
    embed: EmbedRequest | None = None,
    served: Sequence[str] | None = None,
    tool_parser: str | None = None,
    line_embed: EmbedRequest | None = None,
    matryoshka: Matryoshka | None = None,
) -> PreparedWindow:
    """Tokenize, resolve per-row sampling parameters and plan one window (CPU work: run it
    in a worker thread). Rows without a ``custom_id`` of their own use their row id as one
    in OpenAI output; the input guarantees both are unique (`io.row_ids`). `adapters`: the
    job's LoRA adapter names (a row names one by `lora`, or an OpenAI line by body.model);
    with any, each row's adapter is kept in a `lora` column. `served`: the base model's names
    an OpenAI line's body.model may give (None: any name runs on the base model);
    `tool_parser`: the job's --tool-call-parser (without one, a tool_choice auto row fails);
    `line_embed`: how a generate job embeds its /v1/embeddings lines (body.dimensions each);
    `matryoshka`: whether the model honours an embeddings line's body.dimensions (None: it
    does, unchecked)."""
    embeds: dict[int, EmbedRequest] = {}  # a generate job's embeddings lines
    extra: dict[int, tuple[tuple[int, ...], ...]] = {}  # lines of several prompts
    encodings = encoder.encode(input_rows)
    scored = score_encodings(encoder, input_rows, encodings)
    staged: list[tuple[InputRow, tuple[int, ...] | None, SamplingParams | None, str | None]] = []
    for row, encoding in zip(input_rows, encodings, strict=True):
        if row.index != start + len(staged):
            raise AstraiBatchError(
                f"window {number} expected row {start + len(staged)}, got {row.index}"
            )
        if encoding.error is not None:
            staged.append((row, None, None, encoding.error))
            continue
        problem = unserved_model_message(row, served, adapters)
        scoring_or_embedding = (
            embed is not None or row.embedding is not None or row.index - start in scored
        )
        if problem is None and encoding.images and scoring_or_embedding:
            problem = "a scoring or embedding row takes no images (generation rows do)"
        if problem is None and row.tool_choice == "auto" and tool_parser is None:
            problem = AUTO_TOOLS_MESSAGE
        if problem is None and row.embedding is not None and matryoshka is not None:
            problem = matryoshka.problem(row.overrides.get("dimensions"))
        if problem is not None:
            staged.append((row, None, None, problem))
            continue
        row_embed = embed
        if embed is None and row.embedding is not None:
            row_embed = line_embedding(row, line_embed)
            if isinstance(row_embed, str):
                staged.append((row, None, None, row_embed))
                continue
            embeds[row.index] = row_embed
        params = row_params(base_params, row.overrides) if row_embed is None else base_params
        if row_embed is not None and embed is None:
            params = EMBED_LINE_PARAMS
        adapter = row_adapter(row, adapters)
        if adapter is not None and adapter not in adapters:
            staged.append((row, None, None, unknown_adapter_message(adapter, adapters)))
            continue
        if embed is not None:
            problem = embed_row_problem(row.overrides, embed)
            if problem is not None:
                staged.append((row, None, None, problem))
                continue
        if isinstance(params, str):
            staged.append((row, None, None, params))
        else:
            staged.append((row, encoding.token_ids, params, None))
            if encoding.extra:
                extra[row.index] = encoding.extra
    runnable = [position for position, item in enumerate(staged) if item[3] is None]
    plan = plan_window(
        [staged[position][1] or () for position in runnable],
        page_size=page_size,
        group_offset=group_offset,
        enable_grouping=grouping,
        adapters=[row_adapter(staged[position][0], adapters) for position in runnable],
    )
    group_of = {runnable[p]: plan.prefix_group[p] for p in range(len(runnable))}
    rows = [
        PreparedRow(
            index=row.index,
            id=row.id,
            custom_id=row.id if row.custom_id is None else row.custom_id,
            kind=row.kind,
            kept={**row.kept, LORA_COLUMN: row_adapter(row, adapters)} if adapters else row.kept,
            token_ids=token_ids,
            params=params,
            error=error,
            prefix_group=group_of.get(position),
            adapter=None if error is not None else row_adapter(row, adapters),
            continuations=scored.get(position) if error is None else None,
            embed=(embed or embeds.get(row.index)) if error is None else None,
            tool_choice=row.tool_choice if error is None else None,
            echo=row.echo if error is None else None,
            embedding=row.embedding if error is None else None,
            best_of=row.best_of if error is None else None,
            extra_token_ids=extra.get(row.index, ()) if error is None else (),
            images=encodings[position].images if error is None else (),
        )
        for position, (row, token_ids, params, error) in enumerate(staged)
    ]
    return PreparedWindow(
        number=number,
        start=start,
        rows=rows,
        order=tuple(runnable[p] for p in plan.order),
        group_offset=group_offset,
        num_groups=plan.num_groups,
    )
