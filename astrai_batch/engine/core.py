"""The synchronous engine core: requests in, one model step at a time, results out.

It ties the scheduler, the model runner and the samplers together and owns the sequences.
Everything here runs on one thread (the async engine calls `step` from a worker thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.engine_setup import assemble_engine
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.numerics.invariance_probe import check_invariance_at_start
from astrai_batch.engine.request_checks import unknown_adapter_message, why_never_fits
from astrai_batch.engine.sampling.constraints.backend import (
    ConstraintBackend,
    ConstraintCompileError,
)
from astrai_batch.engine.sampling.constraints.mask_filler import StepMasks
from astrai_batch.engine.sampling.constraints.sequence_matchers import SequenceMatchers
from astrai_batch.engine.sampling.prompt_logprobs import (
    record_rows,
    record_top_logprobs,
    top_logprob_rows,
    with_logit_spans,
)
from astrai_batch.engine.sampling.token_sampling import sample_token_ids
from astrai_batch.engine.scheduler import ScheduledWork, Scheduler, chunk_for
from astrai_batch.engine.sequences.request_sequences import request_sequences
from astrai_batch.engine.sequences.sequence import Sequence
from astrai_batch.engine.sequences.sequence_endings import SequenceEndings
from astrai_batch.engine.sequences.step_counters import StepCounters
from astrai_batch.engine.tasks.task_requests import RequestCounts, TaskRequests
from astrai_batch.engine.types import (
    EngineStats,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    as_token_tuple,
    error_result,
)
from astrai_batch.engine.vision.image_inputs import check_image_prompt, real_prompt
from astrai_batch.engine.vision.image_spans import image_run_problem


class EngineCore:
    """`static_decode=True` runs decode-only steps through the CUDA-graph path's static,
    bucketed forward even where nothing is captured (on CPU): how tests compare that path
    with the normal one. Graphs themselves follow `config.cuda_graphs`. Under invariant
    numerics the engine checks them at start (`invariance_probe`) unless told not to."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        *,
        static_decode: bool = False,
        invariance_probe: bool = True,
    ) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        if invariance_probe and config.numerics == "invariant":
            # before this engine is assembled: the probe's engines come and go first (with
            # tensor parallelism every rank follows the engine assembled last)
            check_invariance_at_start(
                loaded,
                config,
                lambda probe: EngineCore(
                    loaded, probe, static_decode=static_decode, invariance_probe=False
                ),
                decode_path="static" if static_decode else "eager",
            )
        parts = assemble_engine(loaded, config, static_decode=static_decode)
        self.max_model_len = parts.max_model_len
        self.attention_backend = parts.attention_backend
        self.pool = parts.pool
        self.cache = parts.cache
        self.runner = parts.runner
        self.lora = self.runner.lora  # the model's LoRA adapters, or None
        self._usable_pages = parts.usable_pages
        # (request id, sample index, logits row) of every sampled position; tests of the
        # batch-invariance promise compare these bitwise
        self.logits_observer: Callable[[Hashable, int, torch.Tensor], None] | None = None
        vision = loaded.vision
        whole_images = vision is not None and vision.bidirectional_images
        self.scheduler = Scheduler(config, self.cache, whole_images=whole_images)
        self.constraints = SequenceMatchers(self._constraint_backend)
        self.endings = SequenceEndings(self.tokenizer, self.constraints)
        self.counts = RequestCounts()
        self.tasks = TaskRequests(
            loaded,
            config,
            self.scheduler,
            self.cache,
            self.pool,
            max_model_len=self.max_model_len,
            usable_pages=self._usable_pages,
            counts=self.counts,
            lora=self.lora,
        )
        self.counters = StepCounters()
        self._top_logprobs = 0  # requests that asked for top_logprobs (any: the check runs)
        self._image_tokens_cached = 0  # finished requests' image tokens read from the cache

    # -- requests ------------------------------------------------------------------------

    @property
    def num_unfinished(self) -> int:
        return self.scheduler.num_unfinished

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def add_request(self, request: GenerationRequest) -> list[GenerationResult]:
        """Queues a request; returns error results at once when it can never run."""
        params = request.params
        prompt = as_token_tuple(request.prompt_token_ids)
        if request.score is not None:
            return self.tasks.add_score(request, prompt)
        if request.embed is not None:
            return self.tasks.add_embed(request, prompt)
        real, images = None, ()
        if request.images:
            real, images, problem = self._image_prompt(request, prompt)
            if problem is not None:
                self.counts.failed += params.n
                return [error_result(request, problem, i) for i in range(params.n)]
        problem = why_never_fits(
            prompt if real is None else real,
            params.max_tokens,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
            page_size=self.config.page_size,
            usable_pages=self._usable_pages,
            logit_bias=params.logit_bias,
        )
        if problem is not None:
            self.counts.failed += params.n
            return [error_result(request, problem, i) for i in range(params.n)]
        adapter = 0 if request.adapter is None else self._adapter_slot(request.adapter)
        if adapter is None:
            self.counts.failed += params.n
            known = () if self.lora is None else self.lora.names
            message = unknown_adapter_message(request.adapter, known)
            return [error_result(request, message, i) for i in range(params.n)]
        compiled = None
        if params.constraint is not None:
            try:
                compiled = self.constraints.compile(params.constraint)
            except ConstraintCompileError as exc:
                self.counts.failed += params.n
                return [error_result(request, str(exc), i) for i in range(params.n)]
        self.counts.arrivals += 1
        self._top_logprobs += params.top_logprobs > 0
        for seq in request_sequences(
            request,
            prompt,
            adapter=adapter,
            counts=self.counts,
            eos_token_ids=self.loaded.eos_token_ids,
            engine_seed=self.config.seed,
            page_size=self.config.page_size,
            max_model_len=self.max_model_len,
            real_prompt=real,
            images=images,
        ):
            self.endings.watch(seq.seq_id, params)
            if compiled is not None:
                self.constraints.attach(seq.seq_id, compiled)
            self.scheduler.add(seq)
        return []

    def _image_prompt(self, request: GenerationRequest, prompt: tuple[int, ...]):
        """(the prompt as the model's tokens, the images with their pixels, None) for a
        request with images, or (None, (), why it cannot run). Pixels a job left to load are
        loaded here: only requests in the engine hold them."""
        tower = self.loaded.vision
        if tower is None:
            return None, (), f"model {self.loaded.name!r} takes no images (no vision tower)"
        problem = check_image_prompt(prompt, request.images)
        if problem is None:
            try:  # a family's own check of an image's extras (Qwen-VL: its grid)
                lengths = tower.image_lengths([image.extras for image in request.images])
            except ValueError as exc:
                return None, (), str(exc)
            for image, length in zip(request.images, lengths, strict=True):
                if image.length != length:
                    problem = f"an image takes {length} placeholder tokens with this model"
                    break
            if problem is None and tower.bidirectional_images:  # in one chunk (`image_spans`)
                problem = image_run_problem(request.images, self.config.max_num_batched_tokens)
        if problem is not None:
            return None, (), problem
        try:
            images = tuple(image.materialized() for image in request.images)
        except Exception as exc:  # the loader's own one-line reason (a file gone, changed)
            return None, (), " ".join(str(exc).split()) or type(exc).__name__
        return real_prompt(prompt, tower.image_token_id), images, None

    def _adapter_slot(self, name: str) -> int | None:
        return None if self.lora is None else self.lora.slot(name)

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[GenerationResult]:
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.work:
            if self.scheduler.num_unfinished:
                raise RuntimeError(
                    "scheduler made no progress with work pending; this is a bug "
                    f"(waiting={len(self.scheduler.waiting)}, "
                    f"running={len(self.scheduler.running)})"
                )
            return []
        cache = self.cache
        chunks = [chunk_for(item, cache) for item in plan.work]
        chunks, logit_rows = with_logit_spans(plan.work, chunks)
        work = zip(plan.work, chunks, strict=True)
        sampling = [item for item, chunk in work if chunk.wants_logits]
        # Grammar masks are filled in a worker thread while the forward runs.
        if self.constraints.active:
            self.constraints.start_step([item.seq.seq_id for item in sampling])
        keeps_rows = logit_rows is not None and bool(logit_rows.positions)
        self.tasks.arm(keeps_rows)
        try:
            output = self.runner.forward(chunks)
        finally:
            masks = self.constraints.finish_step()
        self.counters.forward_done(output.timer)
        self.scheduler.after_step(plan.work)
        logits = output.logits
        if logit_rows is not None:
            record_rows(logits[len(sampling) :], logit_rows)
            if keeps_rows:
                self.tasks.store(logit_rows, len(sampling))
            logits = logits[: len(sampling)]
        if sampling:
            results = self._sample(sampling, logits, masks)
            self.counters.read_timers()  # the tokens are read: no sync (see StepCounters)
        else:
            results = []
        if self.tasks.active:
            results.extend(self.tasks.after_step(plan.work))
        self.counters.busy_seconds += time.perf_counter() - started
        return results

    def _sample(
        self, work: list[ScheduledWork], logits: torch.Tensor, masks: StepMasks | None
    ) -> list[GenerationResult]:
        seqs = [item.seq for item in work]
        if self.logits_observer is not None:
            for seq, row in zip(seqs, logits, strict=True):
                self.logits_observer(seq.request_id, seq.sample_index, row)
        # top_logprobs are of the raw distribution: read before the masks overwrite `logits`
        top = top_logprob_rows(seqs, logits) if self._top_logprobs else None
        token_ids, logprobs = sample_token_ids(logits, [seq.sampler for seq in seqs], masks)
        if top is not None:
            record_top_logprobs(seqs, top, token_ids)
        if self.constraints.active:
            self.constraints.accept([seq.seq_id for seq in seqs], token_ids)
        now = time.perf_counter()
        results = []
        self.counters.decode_tokens += len(seqs)
        for i, seq in enumerate(seqs):
            token = token_ids[i]
            tokens = seq.tokens
            tokens.append(token)
            sampler = seq.sampler
            sampler.append(token)
            if logprobs is not None and logprobs[i] is not None:
                seq.logprobs.append(logprobs[i])
            if seq.first_token_at is None:
                seq.first_token_at = now
            # the full check only where the token can end the sequence (see Sequence)
            if (
                seq.ends_by_text_or_grammar
                or token in sampler.early_stop_ids
                or len(tokens) >= seq.length_limit
            ):
                reason = self.endings.reason(seq, token)
                if reason is not None:
                    results.append(self._finish(seq, reason))
        return results

    def _finish(self, seq: Sequence, reason: FinishReason) -> GenerationResult:
        self.scheduler.finish(seq)
        self.counts.finished += 1
        self.constraints.release(seq.seq_id)
        if seq.images and seq.sample_index == 0:  # a request's count, like its cached_tokens
            cached = seq.cached_tokens or 0
            self._image_tokens_cached += sum(
                image.placeholders_before(cached) for image in seq.images
            )
        return self.endings.result(seq, reason)

    # -- statistics ------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        counters = self.counters
        counters.read_timers()
        encoder = self.runner.encoder_counts()
        return EngineStats(
            steps=counters.steps,
            prefill_tokens=self.scheduler.prefill_tokens,
            decode_tokens=counters.decode_tokens,
            preemptions=self.scheduler.preemptions,
            requests_finished=self.counts.finished,
            requests_failed=self.counts.failed,
            forward_seconds=counters.forward_seconds,
            busy_seconds=counters.busy_seconds,
            constrained_requests=self.constraints.constrained_requests,
            grammars_compiled=self.constraints.grammars_compiled,
            grammar_compile_seconds=self.constraints.compile_seconds,
            mask_fill_seconds=self.constraints.fill_seconds,
            mask_wait_seconds=self.constraints.wait_seconds,
            images_encoded=encoder.encoded,
            image_encodes_saved=encoder.reused,
            image_tokens_cached=self._image_tokens_cached,
            cache=self.cache.stats(),
        )

    def close(self) -> None:
        """Stops the mask worker thread and drops the hidden-state hook (the engine is
        unusable afterwards)."""
        self.constraints.close()
        self.tasks.close()

    def check_invariants(self) -> None:
        self.cache.check_invariants()
        for seq in self.scheduler.running:
            if len(self.cache.pages(seq.seq_id)) * self.config.page_size < seq.num_computed:
                raise RuntimeError(f"sequence {seq.seq_id} computed past its pages")
        live = {seq.seq_id: seq for seq in (*self.scheduler.running, *self.scheduler.waiting)}
        self.constraints.check_invariants(lambda seq_id: live[seq_id].sampler.num_generated)

    def _constraint_backend(self) -> ConstraintBackend:
        from astrai_batch.engine.sampling.constraints.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(
            self.tokenizer,
            vocab_size=self.loaded.model.config.vocab_size,
            eos_token_ids=self.loaded.eos_token_ids,
        )
