"""The running part of a job: windows stream into the engine, finished rows into checkpoints.

A feeder (an async generator the engine pulls from, so it applies backpressure) reads and
prepares windows in a worker thread and yields each window's requests in planned order. It
prepares the next window while the current one finishes, but submits it only once the
current one is complete, so every engine counter between two flushes belongs to one window.
Finished rows are saved to the checkpoint every `checkpoint_rows` rows, every
`checkpoint_seconds` seconds and at the end of each window (`pending_part`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pyarrow as pa

from astrai_batch.engine import Engine, EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.engine.types import GenerationRequest, GenerationResult
from astrai_batch.errors import AstraiBatchError, JobAbortedError
from astrai_batch.io import InputRow, InputSource
from astrai_batch.jobs.executors.base import ExecutionResult
from astrai_batch.jobs.executors.ordering import SampleCollector
from astrai_batch.jobs.executors.pending_part import PendingPart
from astrai_batch.jobs.field_warnings import IgnoredFieldWarnings
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.openai_options import served_names
from astrai_batch.jobs.output.checkpoint import Checkpoint, WindowRecord
from astrai_batch.jobs.output.records import error_record, row_records
from astrai_batch.jobs.output.response_parsing import ResponseParsing
from astrai_batch.jobs.output.timeline import TimelineRecorder
from astrai_batch.jobs.planning.embed_rows import job_embed_request, read_matryoshka
from astrai_batch.jobs.planning.tokenize import PromptEncoder
from astrai_batch.jobs.planning.window import (
    PreparedRow,
    PreparedWindow,
    line_sample,
    prepare_window,
    read_window,
    request_row,
)
from astrai_batch.jobs.progress import Progress, ProgressSnapshot
from astrai_batch.jobs.signals import SignalWatcher


class JobExecution:
    """Runs the job's remaining windows once (`await execution.run()`)."""

    def __init__(
        self,
        *,
        config: JobConfig,
        loaded: LoadedModel,
        source: InputSource,
        checkpoint: Checkpoint,
        schema: pa.Schema,
        total_rows: int,
        progress: Progress,
        clock: Callable[[], float] = time.monotonic,
        embed: EmbedRequest | None = None,
    ) -> None:
        self.config = config
        self.loaded = loaded
        self.source = source
        self.checkpoint = checkpoint
        # Planned as the checkpoint's job was, whatever this run was given (see config).
        self.planning = checkpoint.planning
        self.total_rows = total_rows
        self.progress = progress
        self.clock = clock
        self.encoder = PromptEncoder(
            loaded.tokenizer,
            loaded.name,
            chat_template_kwargs=config.chat_template_kwargs,
            vision=loaded.vision,
            # the job's limits reach the first load and the engine's reload (`_reload`)
            image_limits=config.image_limits(),
        )
        self.collector = SampleCollector()
        if embed is None and config.task == "embed":  # as the executor resolved it, if it did
            embed = job_embed_request(
                config.pooling,
                config.normalize,
                config.dimensions,
                loaded.model.name_or_path,
                loaded.model.config.hidden_size,
            )
        self.embed = embed
        self.field_warnings = IgnoredFieldWarnings()
        self.parsing = ResponseParsing(
            config.tool_call_parser, config.reasoning_parser, loaded.tokenizer
        )
        # a generate job embeds its /v1/embeddings lines (the url decides), each at its own
        # body.dimensions
        self.line_embed = (
            job_embed_request(
                config.pooling,
                config.normalize,
                None,
                loaded.model.name_or_path,
                loaded.model.config.hidden_size,
            )
            if config.task == "generate"
            else None
        )
        self.matryoshka = read_matryoshka(loaded.model.name_or_path)
        saved = checkpoint.total_stats()
        self.rows_before = saved.input_rows
        self.failed_rows = saved.failed_rows
        self.allowed_errors = (
            None if config.max_errors is None else config.max_errors.allowed(total_rows)
        )
        self._engine: Engine | None = None
        self._scope: anyio.CancelScope | None = None
        self._failure: Exception | None = None
        self._window: PreparedWindow | None = None
        self._window_done = anyio.Event()
        self._remaining = 0
        self._started = clock()
        self._part = PendingPart(
            checkpoint,
            schema,
            every_rows=config.checkpoint_rows,
            every_seconds=config.checkpoint_seconds,
            clock=clock,
            started=self._started,
        )
        self._run_prompt_tokens = 0
        self._run_cached_tokens = 0
        self._run_decode_tokens = 0
        self._engine_tokens_before = 0
        self._run_rows = 0
        self._timeline: TimelineRecorder | None = None

    async def run(self) -> ExecutionResult:
        watcher = SignalWatcher()
        engine_config = EngineConfig(**self.config.engine_options())
        async with Engine(self.loaded, engine_config) as engine:
            self._engine = engine
            self._part.begin(engine.stats())
            self._timeline = TimelineRecorder(
                self.checkpoint.timeline,
                kv_pages=engine.core.cache.num_pages,
                max_num_seqs=engine_config.max_num_seqs,
                clock=self.clock,
            )
            self._timeline.begin(engine.stats())
            self._engine_tokens_before = engine.decode_tokens
            try:
                async with anyio.create_task_group() as tg:
                    self._scope = tg.cancel_scope
                    await tg.start(watcher.watch, tg.cancel_scope)
                    tg.start_soon(self._report_progress)
                    await self._generate(engine)
                    tg.cancel_scope.cancel()
                if self._failure is not None:
                    raise self._failure
            except BaseException:
                # Whatever failed, the finished rows are worth keeping for the rerun.
                try:
                    self._flush()
                except Exception as flush_error:
                    self.progress.message(
                        f"saving finished rows to the checkpoint failed too: {flush_error}"
                    )
                raise
            self._flush()
        return ExecutionResult(self._part.saved, self.clock() - self._started, watcher.signum)

    def check_invariants(self) -> None:
        """Counters agree with the buffered rows; no row finished twice."""
        self.collector.check_invariants()
        if self._remaining < 0:
            raise AstraiBatchError(f"window finished {-self._remaining} rows too many")
        self._part.check_invariants()

    def _fail(self, error: Exception) -> None:
        """Stop the job because of `error`, raised once the engine has wound down.

        Errors come from both sides (the request iterator and the result handler); cancelling
        the job's scope stops the engine at its next await whichever side failed, and the
        first error is the one raised.
        """
        if self._failure is None:
            self._failure = error
        if self._scope is not None:
            self._scope.cancel()

    # -- the two sides of the engine -----------------------------------------------------------

    async def _generate(self, engine: Engine) -> None:
        results = engine.generate(self._requests())
        async with contextlib.aclosing(results):  # type: ignore[type-var]
            async for result in results:
                if self._failure is not None:
                    continue  # the cancellation lands at the engine's next await
                try:
                    self._on_result(result)
                except Exception as error:
                    self._fail(error)

    async def _requests(self) -> AsyncIterator[GenerationRequest]:
        try:
            size = self.planning.group_window
            number = self.checkpoint.first_incomplete_window()
            rows = self.source.iter_rows(start=number * size)
            prepared = await self._prepare(number, rows, self.checkpoint.group_offset(number))
            while prepared is not None:
                done = self._begin_window(prepared)
                for request in prepared.requests(skip=done):
                    yield request
                # Tokenize the next window while this one finishes; submit it only after.
                upcoming = await self._prepare(
                    number + 1, rows, prepared.group_offset + prepared.num_groups
                )
                await self._window_done.wait()
                prepared, number = upcoming, number + 1
        except Exception as error:
            self._fail(error)

    async def _prepare(
        self, number: int, rows: Iterator[InputRow], group_offset: int
    ) -> PreparedWindow | None:
        def work() -> PreparedWindow | None:
            input_rows = read_window(rows, self.planning.group_window)
            if not input_rows:
                return None
            self.field_warnings.see(input_rows)
            return prepare_window(
                number,
                number * self.planning.group_window,
                input_rows,
                encoder=self.encoder,
                base_params=self.config.sampling,
                page_size=self.planning.page_size,
                group_offset=group_offset,
                grouping=self.planning.grouping,
                adapters=tuple(name for name, _ in self.config.lora),
                embed=self.embed,
                served=served_names(
                    self.config.model, self.loaded.name, self.config.served_model_name
                ),
                tool_parser=self.config.tool_call_parser,
                line_embed=self.line_embed,
                matryoshka=self.matryoshka,
            )

        window = await anyio.to_thread.run_sync(work)
        for warning in self.field_warnings.new_warnings():
            self.progress.message(warning)
        return window

    # -- bookkeeping (all on the event loop, between engine steps) -----------------------------

    def _begin_window(self, window: PreparedWindow) -> set[int]:
        """Make `window` current; returns the indices of its rows already checkpointed."""
        self.checkpoint.record_window(
            WindowRecord(
                number=window.number,
                start=window.start,
                rows=len(window.rows),
                group_offset=window.group_offset,
                num_groups=window.num_groups,
            )
        )
        done = self.checkpoint.done_indices(window.number)
        self._window = window
        self._window_done = anyio.Event()
        self._remaining = len(window.rows) - len(done)
        for row in window.rows:
            if row.error is not None and row.index not in done:
                self._complete_row(row, [error_record(row, row.error)])
        self._after_rows()
        return done

    def _on_result(self, result: GenerationResult) -> None:
        window = self._window
        if window is None:
            raise AstraiBatchError(f"result for request {result.request_id!r} outside any window")
        row = window.row(request_row(result.request_id)[0])
        samples = self.collector.add(line_sample(row, result), row.num_samples)
        if samples is not None:
            self._complete_row(row, row_records(row, samples, self.parsing))
            self._after_rows()
        # Here, between two engine steps, the engine's counters hold still.
        if self._timeline is not None and self._engine is not None:
            self._timeline.observe(self._engine.core.cache.stats())
            if self._timeline.is_due():
                self._timeline.sample(self._engine.stats(), self.rows_before + self._run_rows)

    def _complete_row(self, row: PreparedRow, records: list[dict[str, Any]]) -> None:
        if self._window is not None:
            self._window.release(row.index)  # its images: only unfinished rows keep theirs
        self._part.add(records)
        self._remaining -= 1
        self._run_rows += 1
        for record in records:
            self._run_prompt_tokens += record["prompt_tokens"] or 0
            self._run_cached_tokens += record["cached_tokens"] or 0
            self._run_decode_tokens += record["completion_tokens"] or 0
        if records[0]["finish_reason"] == "error":
            self.failed_rows += 1
            if self.allowed_errors is not None and self.failed_rows > self.allowed_errors:
                self._flush()
                limit = self.config.max_errors.describe() if self.config.max_errors else ""
                # A row whose id is missing or repeated has none: name it by its number.
                named = repr(row.id) if row.id is not None else f"{row.index} (no id)"
                raise JobAbortedError(
                    f"{self.failed_rows} rows failed, more than --max-errors {limit} allows "
                    f"({self.allowed_errors} of {self.total_rows} rows); the last: row "
                    f"{named}: {records[0]['error']}"
                )
        self.progress.update(self._snapshot())

    def _snapshot(self) -> ProgressSnapshot:
        # generated tokens count the rows still running too, so the rate moves before any
        # row finishes (with max_tokens 256 the first rows may take minutes)
        generated = self._run_decode_tokens
        if self._engine is not None:
            generated = max(generated, self._engine.decode_tokens - self._engine_tokens_before)
        return ProgressSnapshot(
            rows_done=self.rows_before + self._run_rows,
            total_rows=self.total_rows,
            rows_this_run=self._run_rows,
            generated_tokens=generated,
            prompt_tokens=self._run_prompt_tokens,
            cached_tokens=self._run_cached_tokens,
            elapsed_seconds=self.clock() - self._started,
        )

    async def _report_progress(self) -> None:
        """A snapshot every --progress-seconds, rows finished or not: a log (no terminal)
        gets its line on time even while every row is still generating."""
        while True:
            await anyio.sleep(self.config.progress_seconds)
            self.progress.update(self._snapshot())

    def _after_rows(self) -> None:
        if self._remaining == 0:
            self._flush()
            self._window_done.set()
        elif self._part.is_due():
            self._flush()

    def _flush(self) -> None:
        """Save the finished rows of the current window as one checkpoint part."""
        if not self._part.records or self._window is None or self._engine is None:
            return
        stats = self._engine.stats()
        if self._timeline is not None:
            self._timeline.sample(stats, self.rows_before + self._run_rows, force=True)
            self.checkpoint.timeline = self._timeline.timeline()
        self._part.save(self._window.number, stats)
