"""Continuous batching: which sequences compute which tokens in the next step.

Each step has a token budget (`max_num_batched_tokens`) and a cap on running sequences
(`max_num_seqs`). Running sequences go first, oldest first: decodes take one token each, a
sequence still in prefill takes the next chunk that fits. What budget is left admits waiting
sequences, so long prompts are prefilled in chunks beside the decodes and never stall them.

Admission order is prefix-aware: among waiting sequences the one with the longest cached prefix
goes first (ties: oldest). The waiting list is bounded by the engine's lookahead, so scoring it
costs the same per step whatever the input size; a sequence passed over `max_wait_steps` times
goes first regardless, so none starves. A sequence whose next uncached page is being computed
right now by a running sequence waits for it instead of computing it twice, aged or not (the
running sequence always progresses, so that wait is bounded).

When pages run out, cached pages are evicted first (inside `KVCacheManager.reserve`), then the
newest running sequences are preempted by recompute: their computed pages are published to the
prefix index and released, and they go back to the head of the waiting list.

The same scheduler serves both KV layouts (`cache.layout`). In the contiguous one, admission
also needs a free seat (`can_open`), a seat covers the whole context so `reserve` never fails
and nothing is preempted for pages, and no prefix is ever cached.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from astrai_batch.cache import KVLayout
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.sequences.sequence import Sequence, SequenceStatus
from astrai_batch.engine.vision.image_spans import fit_chunk


class ScheduledWork(NamedTuple):
    """`num_tokens` more tokens of `seq` this step (a named tuple: one per sequence per step)."""

    seq: Sequence
    num_tokens: int

    @property
    def completes_known_tokens(self) -> bool:
        return self.seq.num_computed + self.num_tokens == self.seq.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    work: list[ScheduledWork]
    preempted: int


class Scheduler:
    def __init__(self, config: EngineConfig, cache: KVLayout, whole_images: bool = False) -> None:
        self.config = config
        self.cache = cache
        # an image's placeholders attend to each other (Gemma 3): a prefill chunk never ends
        # inside an image's run of them (`engine.vision.image_spans.fit_chunk`)
        self.whole_images = whole_images
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.peak_running = 0
        # tokens computed by chunks of more than one token or inside the prompt: prompts, and
        # what preempted sequences recompute
        self.prefill_tokens = 0
        self._inflight_pages: Counter[int] = Counter()

    # -- queue ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def adopt(self, seq: Sequence) -> None:
        """Runs a sequence whose pages are already open and partly computed (a scoring
        continuation forked from its context: `engine.scoring`)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._track_inflight(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def finish(self, seq: Sequence) -> None:
        """Releases a finished sequence's pages.

        Everything it computed is published already: `after_step` publishes every page
        filled, and a sequence finishes after the step that computed its last tokens.
        """
        self._untrack_inflight(seq)
        self.running.remove(seq)
        self.cache.close(seq.seq_id)
        seq.status = SequenceStatus.FINISHED

    def after_step(self, work: list[ScheduledWork]) -> None:
        """Advances progress by what was computed and publishes the filled pages.

        `publish` is called only when a page filled up: the pages before the old
        `num_computed // page_size` were published by the previous call (or matched at
        admission), so it would do nothing otherwise. It gets the token list itself when every
        token is computed (a decode), else a copy of the computed ones.
        """
        page = self.cache.page_size
        publish = self.cache.publish
        for seq, num_tokens in work:
            before = seq.num_computed
            prefilling = before < len(seq.prompt_token_ids)
            if prefilling or num_tokens > 1:
                self.prefill_tokens += num_tokens
            if prefilling:
                self._untrack_inflight(seq)
            seq.num_computed = after = before + num_tokens
            if after // page > before // page:
                tokens = seq.tokens
                # a decode has computed every token it has (its next one is not sampled yet)
                publish(seq.seq_id, tokens if len(tokens) == after else tokens[:after])
            if prefilling:
                self._track_inflight(seq)

    # -- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        work: list[ScheduledWork] = []
        preempted_before = self.preemptions
        index = 0
        running = self.running
        reserve = self.cache.reserve
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed
            num = min(len(seq.tokens) - computed, budget)
            if self.whole_images and seq.images:
                num = fit_chunk(seq.images, computed, num)
            if num == 0:
                index += 1
                continue
            # the plain reserve first: it succeeds for nearly every sequence of nearly every step
            if not reserve(seq.seq_id, computed + num) and not self._reserve_or_preempt(
                seq, computed + num
            ):
                continue  # seq itself was preempted; running[index] is now the next one
            work.append(ScheduledWork(seq, num))
            budget -= num
            index += 1
        if self.preemptions == preempted_before:
            budget = self._admit(work, budget)
        return SchedulerOutput(work=work, preempted=self.preemptions - preempted_before)

    def _reserve_or_preempt(self, seq: Sequence, num_tokens: int) -> bool:
        while not self.cache.reserve(seq.seq_id, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._untrack_inflight(seq)
        self.running.remove(seq)
        self.cache.close(seq.seq_id, seq.tokens[: seq.num_computed])
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.was_preempted = True
        self.waiting.insert(0, seq)
        self.preemptions += 1

    def _admit(self, work: list[ScheduledWork], budget: int) -> int:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return budget
        admitted: list[Sequence] = []
        for seq, cached in self._admission_order():
            if (
                budget <= 0
                or len(self.running) >= self.config.max_num_seqs
                or not self.cache.can_open()  # the contiguous layout: no free seat
            ):
                break
            # Even an aged sequence waits for in-flight pages: the wait ends within a few steps,
            # as the running sequence computing them always progresses, and recomputing them
            # would put the same prefix into the pool twice.
            if self._waits_for_inflight(seq, cached):
                continue
            # The lookup counts once per sequence, at its first admission; a refused attempt
            # (no pages) and a preempted sequence's return count nothing.
            hit = self.cache.open(
                seq.seq_id,
                seq.tokens,
                max_cached_tokens=seq.cache_limit,
                count_lookup=seq.cached_tokens is None,
                namespace=seq.adapter,
            )
            num = min(seq.num_tokens - hit, budget)
            if self.whole_images and seq.images:
                num = fit_chunk(seq.images, hit, num)
                if num == 0:  # the rest of its image does not fit this step: a later one
                    self.cache.close(seq.seq_id)
                    continue
            if not self.cache.reserve(seq.seq_id, hit + num):
                self.cache.close(seq.seq_id)
                break
            seq.num_computed = hit
            if seq.cached_tokens is None:
                seq.cached_tokens = hit
                seq.admitted_at = time.perf_counter()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._track_inflight(seq)
            work.append(ScheduledWork(seq, num))
            budget -= num
            admitted.append(seq)
        self.peak_running = max(self.peak_running, len(self.running))
        if admitted:
            ids = {id(s) for s in admitted}
            self.waiting = [s for s in self.waiting if id(s) not in ids]
            for seq in self.waiting:
                seq.admissions_waited += len(admitted)
        return budget

    def _admission_order(self) -> list[tuple[Sequence, int]]:
        """Aged (or preempted) first, then the longest cached prefix, then the oldest.

        Scored once per step over the bounded waiting list; admissions in the same step do not
        change what is cached, so the order stays valid while the step admits.
        """
        scored = []
        for seq in self.waiting:
            cached = self.cache.cached_prefix_length(seq.tokens, seq.cache_limit, seq.adapter)
            scored.append(((0 if self._is_aged(seq) else 1, -cached, seq.arrival), seq, cached))
        scored.sort(key=lambda item: item[0])
        return [(seq, cached) for _, seq, cached in scored]

    def _is_aged(self, seq: Sequence) -> bool:
        return seq.was_preempted or seq.admissions_waited >= self.config.max_wait_steps

    def _waits_for_inflight(self, seq: Sequence, cached: int) -> bool:
        """True when the first page this sequence would compute is being computed right now."""
        return seq.prompt_page_hash(cached // self.cache.page_size) in self._inflight_pages

    # -- pages being computed right now ---------------------------------------------------

    def _inflight_hashes(self, seq: Sequence) -> list[int]:
        page = self.cache.page_size
        first = seq.num_computed // page
        last = seq.prompt_len // page
        hashes = []
        for index in range(first, last):
            value = seq.prompt_page_hash(index)
            if value is not None:
                hashes.append(value)
        return hashes

    def _track_inflight(self, seq: Sequence) -> None:
        # Without prefix caching a sequence gains nothing by waiting for another's pages.
        if seq.in_prefill and self.cache.caches_prefixes:
            self._inflight_pages.update(self._inflight_hashes(seq))

    def _untrack_inflight(self, seq: Sequence) -> None:
        if not seq.in_prefill or not self.cache.caches_prefixes:
            return
        for value in self._inflight_hashes(seq):
            left = self._inflight_pages[value] - 1
            if left > 0:
                self._inflight_pages[value] = left
            else:
                del self._inflight_pages[value]


def chunk_for(item: ScheduledWork, cache: KVLayout) -> ScheduledChunk:
    """What the runner computes for a scheduled sequence: its next tokens and page table."""
    seq, num_tokens = item
    start = seq.num_computed
    end = start + num_tokens
    pages, version = cache.pages_and_version(seq.seq_id)
    # positional: token_ids, start, pages, wants_logits, seq_key, pages_version, adapter
    return ScheduledChunk(
        seq.tokens[start:end],
        start,
        pages,
        end == len(seq.tokens),
        seq.seq_id,
        version,
        seq.adapter,
        images=seq.images,
    )
