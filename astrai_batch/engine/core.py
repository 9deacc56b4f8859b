"""The synchronous engine core: requests in, one model step at a time, results out.

It ties the scheduler, the model runner and the samplers together and owns the sequences.
Everything here runs on one thread (the async engine calls `step` from a worker thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.embedding import EmbedTargets, HiddenCapture, store_hidden
from astrai_batch.engine.engine_setup import assemble_engine
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.request_checks import fallback_seed, why_never_fits
from astrai_batch.engine.runner.forward_timer import ForwardTimer
from astrai_batch.engine.sampling.constraints.backend import (
    ConstraintBackend,
    ConstraintCompileError,
)
from astrai_batch.engine.sampling.constraints.mask_filler import StepMasks
from astrai_batch.engine.sampling.constraints.sequence_matchers import SequenceMatchers
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.prompt_logprobs import (
    prompt_results,
    prompt_targets,
    record_rows,
    record_top_logprobs,
    token_texts,
    with_logit_spans,
)
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
from astrai_batch.engine.sampling.stop_strings import StopStringTracker
from astrai_batch.engine.sampling.token_sampling import sample_token_ids
from astrai_batch.engine.scheduler import ScheduledWork, Scheduler, chunk_for
from astrai_batch.engine.scoring import ScoreGroups
from astrai_batch.engine.scoring_types import score_problem
from astrai_batch.engine.sequence import Sequence
from astrai_batch.engine.types import (
    EngineStats,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    Timings,
    as_token_tuple,
    error_result,
)

# a scoring sequence samples nothing; its sampler exists because every sequence has one
SCORING_PARAMS = SamplingParams(max_tokens=1)


class EngineCore:
    """`static_decode=True` runs decode-only steps through the CUDA-graph path's static,
    bucketed forward even where nothing is captured (on CPU): how tests compare that path
    with the normal one. Graphs themselves follow `config.cuda_graphs`."""

    def __init__(
        self, loaded: LoadedModel, config: EngineConfig, *, static_decode: bool = False
    ) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        parts = assemble_engine(loaded, config, static_decode=static_decode)
        self.max_model_len = parts.max_model_len
        self.attention_backend = parts.attention_backend
        self.pool = parts.pool
        self.cache = parts.cache
        self.runner = parts.runner
        self._usable_pages = parts.usable_pages
        # (request id, sample index, logits row) of every sampled position; tests of the
        # batch-invariance promise compare these bitwise
        self.logits_observer: Callable[[Hashable, int, torch.Tensor], None] | None = None
        self.scheduler = Scheduler(config, self.cache)
        self._outputs: dict[int, StopStringTracker] = {}
        self.constraints = SequenceMatchers(self._constraint_backend)
        self.scoring = ScoreGroups(self.scheduler, self.cache, self.pool, self._scoring_sequence)
        self._next_seq_id = 0
        self._arrivals = 0
        self._steps = 0
        self._decode_tokens = 0
        self._finished = 0
        self._failed = 0
        self._forward_seconds = 0.0
        self._pending_timers: list[ForwardTimer] = []  # forwards not yet read (see step)
        self._busy_seconds = 0.0
        self._top_logprobs = 0  # requests that asked for top_logprobs (any: the check runs)
        self._embeds = 0  # embedding sequences in flight
        self._hidden: HiddenCapture | None = None  # made at the first embedding request

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
            return self._add_score(request, prompt)
        if request.embed is not None:
            return self._add_embed(request, prompt)
        problem = why_never_fits(
            prompt,
            params.max_tokens,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
            page_size=self.config.page_size,
            usable_pages=self._usable_pages,
        )
        if problem is not None:
            self._failed += params.n
            return [error_result(request, problem, i) for i in range(params.n)]
        compiled = None
        if params.constraint is not None:
            try:
                compiled = self.constraints.compile(params.constraint)
            except ConstraintCompileError as exc:
                self._failed += params.n
                return [error_result(request, str(exc), i) for i in range(params.n)]
        self._arrivals += 1
        self._top_logprobs += params.top_logprobs > 0
        seed_key = request.request_id if request.seed_key is None else request.seed_key
        for sample_index in range(params.n):
            seq_id = self._next_seq_id
            self._next_seq_id += 1
            sampler = SequenceSampler(
                params,
                prompt,
                sample_index=sample_index,
                eos_token_ids=self.loaded.eos_token_ids,
                fallback_seed=fallback_seed(self.config.seed, seed_key, sample_index),
            )
            seq = Sequence(
                seq_id=seq_id,
                request_id=request.request_id,
                sample_index=sample_index,
                prompt_token_ids=prompt,
                params=params,
                sampler=sampler,
                arrival=self._arrivals,
                page_size=self.config.page_size,
                max_model_len=self.max_model_len,
            )
            if params.stop:
                self._outputs[seq_id] = StopStringTracker(
                    self.tokenizer, params.stop, params.min_tokens
                )
            if compiled is not None:
                self.constraints.attach(seq_id, compiled)
            seq.targets = prompt_targets(prompt, params.prompt_logprobs)
            self.scheduler.add(seq)
        return []

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
        if self._embeds:
            self._hidden.armed = keeps_rows
        try:
            output = self.runner.forward(chunks)
        finally:
            masks = self.constraints.finish_step()
        self._steps += 1
        self.scheduler.after_step(plan.work)
        self._pending_timers.append(output.timer)
        logits = output.logits
        if logit_rows is not None:
            record_rows(logits[len(sampling) :], logit_rows)
            if self._embeds and keeps_rows:
                store_hidden(self._hidden.take()[len(sampling) :], logit_rows)
            logits = logits[: len(sampling)]
        if sampling:
            results = self._sample(sampling, logits, masks)
            # on CUDA the tokens' read waited for this forward (and every earlier one), so
            # reading the timers costs no synchronization
            self._read_timers()
        else:
            results = []
        if self.scoring.active:
            results.extend(self._scored(plan.work))
        if self._embeds:
            results.extend(self._embedded(plan.work))
        self._busy_seconds += time.perf_counter() - started
        return results

    # -- scoring requests (see `scoring`) ----------------------------------------------------

    def _add_score(self, request: GenerationRequest, context: tuple[int, ...]):
        score = request.score
        problem = score_problem(
            context,
            score,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
        )
        if problem is not None:
            self._failed += 1
            return [error_result(request, problem)]
        self._arrivals += 1
        self.scoring.add(request.request_id, context, score)
        return []

    def _add_embed(self, request: GenerationRequest, prompt: tuple[int, ...]):
        problem = why_never_fits(
            prompt,
            0,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
            page_size=self.config.page_size,
            usable_pages=self._usable_pages,
        )
        if problem is not None:
            self._failed += 1
            return [error_result(request, problem)]
        if self._hidden is None:
            self._hidden = HiddenCapture(self.loaded.model)
        self._arrivals += 1
        self._embeds += 1
        targets = EmbedTargets(len(prompt), request.embed)
        self.scheduler.add(self._scoring_sequence(request.request_id, prompt, targets))
        return []

    def _embedded(self, work: list[ScheduledWork]) -> list[GenerationResult]:
        results = []
        for seq, _ in work:
            targets = seq.targets
            if not isinstance(targets, EmbedTargets) or seq.num_computed < len(seq.tokens):
                continue
            self.scheduler.finish(seq)
            self._embeds -= 1
            self._finished += 1
            vector = targets.embedding()
            results.append(
                GenerationResult(
                    request_id=seq.request_id,
                    sample_index=0,
                    token_ids=(),
                    text="",
                    finish_reason="stop",
                    prompt_tokens=seq.prompt_len,
                    cached_tokens=seq.cached_tokens or 0,
                    completion_tokens=0,
                    embedding=tuple(vector.tolist()),
                )
            )
        return results

    def _scoring_sequence(self, request_id, tokens, targets) -> Sequence:
        params = SCORING_PARAMS
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        seq = Sequence(
            seq_id=seq_id,
            request_id=request_id,
            sample_index=0,
            prompt_token_ids=tokens,
            params=params,
            sampler=SequenceSampler(
                params, tokens, sample_index=0, eos_token_ids=(), fallback_seed=0
            ),
            arrival=self._arrivals,
            page_size=self.config.page_size,
            max_model_len=self.max_model_len,
        )
        seq.targets = targets
        return seq

    def _scored(self, work: list[ScheduledWork]) -> list[GenerationResult]:
        results = []
        for request_id, context_len, cached, scores in self.scoring.after_step(work):
            self._finished += 1
            results.append(
                GenerationResult(
                    request_id=request_id,
                    sample_index=0,
                    token_ids=(),
                    text="",
                    finish_reason="stop",
                    prompt_tokens=context_len,
                    cached_tokens=cached,
                    completion_tokens=0,
                    scores=scores,
                )
            )
        return results

    def _sample(
        self, work: list[ScheduledWork], logits: torch.Tensor, masks: StepMasks | None
    ) -> list[GenerationResult]:
        seqs = [item.seq for item in work]
        if self.logits_observer is not None:
            for seq, row in zip(seqs, logits, strict=True):
                self.logits_observer(seq.request_id, seq.sample_index, row)
        token_ids, logprobs = sample_token_ids(logits, [seq.sampler for seq in seqs], masks)
        if self._top_logprobs:
            record_top_logprobs(seqs, logits, token_ids)
        if self.constraints.active:
            self.constraints.accept([seq.seq_id for seq in seqs], token_ids)
        now = time.perf_counter()
        results = []
        self._decode_tokens += len(seqs)
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
                reason = self._finish_reason(seq, token)
                if reason is not None:
                    results.append(self._finish(seq, reason))
        return results

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        num_tokens = len(seq.tokens)
        generated = num_tokens - len(seq.prompt_token_ids)
        output = self._outputs.get(seq.seq_id)
        if output is not None and output.append(token):
            return "stop"
        if self.constraints.terminated(seq.seq_id):
            return "stop"  # the grammar is complete and accepted an end token
        # min_tokens holds off every stop: stop strings in the tracker, stop ids and EOS (unless
        # ignored: the sampler's early-stop ids) here; the sampler masks them too, so the first
        # that can end a row is token min_tokens + 1.
        if generated > seq.params.min_tokens and token in seq.sampler.early_stop_ids:
            return "stop"
        if num_tokens >= seq.length_limit:  # max_tokens, or the model's context
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> GenerationResult:
        self.scheduler.finish(seq)
        self._finished += 1
        self.constraints.release(seq.seq_id)
        output = self._outputs.pop(seq.seq_id, None)
        ids = seq.output_token_ids
        if output is not None and output.cut is not None:
            text = output.text
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        now = time.perf_counter()
        prompt_logprobs = prompt_results(seq.targets)
        top_logprobs = tuple(seq.top_logprobs) if seq.params.top_logprobs else None
        return GenerationResult(
            request_id=seq.request_id,
            sample_index=seq.sample_index,
            token_ids=tuple(ids),
            text=text,
            finish_reason=reason,
            prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached_tokens or 0,
            completion_tokens=len(ids),
            logprobs=tuple(seq.logprobs) if seq.params.logprobs else None,
            prompt_logprobs=prompt_logprobs,
            top_logprobs=top_logprobs,
            token_texts=token_texts(self.tokenizer, prompt_logprobs, top_logprobs),
            timings=Timings(
                queued_seconds=(seq.admitted_at or now) - seq.submitted_at,
                first_token_seconds=(
                    seq.first_token_at - seq.submitted_at if seq.first_token_at else None
                ),
                total_seconds=now - seq.submitted_at,
            ),
        )

    # -- statistics ------------------------------------------------------------------------

    def _read_timers(self) -> None:
        for timer in self._pending_timers:
            self._forward_seconds += timer.seconds()
        self._pending_timers.clear()

    def stats(self) -> EngineStats:
        self._read_timers()
        return EngineStats(
            steps=self._steps,
            prefill_tokens=self.scheduler.prefill_tokens,
            decode_tokens=self._decode_tokens,
            preemptions=self.scheduler.preemptions,
            requests_finished=self._finished,
            requests_failed=self._failed,
            forward_seconds=self._forward_seconds,
            busy_seconds=self._busy_seconds,
            constrained_requests=self.constraints.constrained_requests,
            grammars_compiled=self.constraints.grammars_compiled,
            grammar_compile_seconds=self.constraints.compile_seconds,
            mask_fill_seconds=self.constraints.fill_seconds,
            mask_wait_seconds=self.constraints.wait_seconds,
            cache=self.cache.stats(),
        )

    def close(self) -> None:
        """Stops the mask worker thread and drops the hidden-state hook (the engine is
        unusable afterwards)."""
        self.constraints.close()
        if self._hidden is not None:
            self._hidden.remove()

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
