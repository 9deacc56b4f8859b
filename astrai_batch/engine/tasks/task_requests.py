"""The core's requests that never decode: scoring (`scoring`) and embedding (`embedding`).

Both run as sequences that sample nothing and leave the step once the positions they want
are computed: a scoring request as a context and its continuation branches (`ScoreGroups`),
an embedding request as one sequence whose pooled rows' hidden states a pre-hook on the
output layer keeps (`HiddenCapture`, made at the first embedding request and armed only for
steps that keep rows). A request's LoRA adapter (`GenerationRequest.adapter`) goes to every
sequence it makes, branches included, so its pages are that adapter's in the prefix cache.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from astrai_batch.cache import KVPool
from astrai_batch.cache.layout import KVLayout
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.lora.bank import LoraBank
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.request_checks import unknown_adapter_message, why_never_fits
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.prompt_logprobs import LogitRows, PositionTargets
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
from astrai_batch.engine.scheduler import ScheduledWork, Scheduler
from astrai_batch.engine.sequences.sequence import Sequence
from astrai_batch.engine.tasks.embedding import EmbedTargets, HiddenCapture, store_hidden
from astrai_batch.engine.tasks.scoring import ScoreGroups
from astrai_batch.engine.tasks.scoring_types import score_problem
from astrai_batch.engine.types import GenerationRequest, GenerationResult, error_result

# a scoring sequence samples nothing; its sampler exists because every sequence has one
SCORING_PARAMS = SamplingParams(max_tokens=1)


@dataclass
class RequestCounts:
    """What the core and its task requests count together: sequence ids and request
    outcomes (the engine's statistics)."""

    next_seq_id: int = 0
    arrivals: int = 0
    finished: int = 0
    failed: int = 0

    def new_seq_id(self) -> int:
        seq_id = self.next_seq_id
        self.next_seq_id += 1
        return seq_id


class TaskRequests:
    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        scheduler: Scheduler,
        cache: KVLayout,
        pool: KVPool,
        *,
        max_model_len: int,
        usable_pages: int,
        counts: RequestCounts,
        lora: LoraBank | None,
    ) -> None:
        self.loaded = loaded
        self.config = config
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.usable_pages = usable_pages
        self.counts = counts
        self.lora = lora
        self.scoring = ScoreGroups(scheduler, cache, pool, self._sequence)
        self.embeds = 0  # embedding sequences in flight
        self.hidden: HiddenCapture | None = None
        self._adapters: dict[Hashable, int] = {}  # request id -> adapter slot, while in flight

    @property
    def active(self) -> bool:
        return self.scoring.active or self.embeds > 0

    def add_score(self, request: GenerationRequest, context: tuple[int, ...]):
        problem = score_problem(
            context,
            request.score,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
        ) or self._admit_adapter(request)
        if problem is not None:
            self.counts.failed += 1
            return [error_result(request, problem)]
        self.counts.arrivals += 1
        self.scoring.add(request.request_id, context, request.score)
        return []

    def add_embed(self, request: GenerationRequest, prompt: tuple[int, ...]):
        problem = why_never_fits(
            prompt,
            0,
            vocab_size=self.loaded.model.config.vocab_size,
            max_model_len=self.max_model_len,
            page_size=self.config.page_size,
            usable_pages=self.usable_pages,
        ) or self._admit_adapter(request)
        limit = request.embed.max_prompt_tokens
        if problem is None and limit is not None and len(prompt) > limit:
            problem = (
                f"prompt ({len(prompt)} tokens) exceeds the model's sentence-transformers "
                f"max_seq_length of {limit} tokens (sentence-transformers would truncate it)"
            )
        if problem is not None:
            self.counts.failed += 1
            return [error_result(request, problem)]
        if self.hidden is None:
            self.hidden = HiddenCapture(self.loaded.model)
        self.counts.arrivals += 1
        self.embeds += 1
        targets = EmbedTargets(len(prompt), request.embed)
        self.scheduler.add(self._sequence(request.request_id, prompt, targets))
        return []

    def arm(self, keeps_rows: bool) -> None:
        """Before a forward: keep hidden states only when the step keeps rows."""
        if self.embeds:
            self.hidden.armed = keeps_rows

    def store(self, rows: LogitRows, sampling_rows: int) -> None:
        """After a forward that kept rows: the kept rows' hidden states to their sequences."""
        if self.embeds:
            store_hidden(self.hidden.take()[sampling_rows:], rows)

    def after_step(self, work: list[ScheduledWork]) -> list[GenerationResult]:
        results = []
        if self.scoring.active:
            for request_id, context_len, cached, scores in self.scoring.after_step(work):
                self._adapters.pop(request_id, None)
                results.append(self._result(request_id, context_len, cached, scores=scores))
        if self.embeds:
            for seq, _ in work:
                targets = seq.targets
                if not isinstance(targets, EmbedTargets) or seq.num_computed < len(seq.tokens):
                    continue
                self.scheduler.finish(seq)
                self.embeds -= 1
                self._adapters.pop(seq.request_id, None)
                vector: torch.Tensor = targets.embedding()
                cached = seq.cached_tokens or 0
                embedding = tuple(vector.tolist())
                results.append(
                    self._result(seq.request_id, seq.prompt_len, cached, embedding=embedding)
                )
        return results

    def close(self) -> None:
        if self.hidden is not None:
            self.hidden.remove()

    def _admit_adapter(self, request: GenerationRequest) -> str | None:
        """Records the request's adapter slot for its sequences; the row error when the
        engine has no adapter of that name."""
        if request.adapter is None:
            return None
        slot = None if self.lora is None else self.lora.slot(request.adapter)
        if slot is None:
            known = () if self.lora is None else self.lora.names
            return unknown_adapter_message(request.adapter, known)
        self._adapters[request.request_id] = slot
        return None

    def _sequence(
        self, request_id: Hashable, tokens: tuple[int, ...], targets: PositionTargets
    ) -> Sequence:
        seq = Sequence(
            seq_id=self.counts.new_seq_id(),
            request_id=request_id,
            sample_index=0,
            prompt_token_ids=tokens,
            params=SCORING_PARAMS,
            sampler=SequenceSampler(
                SCORING_PARAMS, tokens, sample_index=0, eos_token_ids=(), fallback_seed=0
            ),
            arrival=self.counts.arrivals,
            page_size=self.config.page_size,
            max_model_len=self.max_model_len,
            adapter=self._adapters.get(request_id, 0),
        )
        seq.targets = targets
        return seq

    def _result(self, request_id, prompt_tokens, cached, **values) -> GenerationResult:
        self.counts.finished += 1
        return GenerationResult(
            request_id=request_id,
            sample_index=0,
            token_ids=(),
            text="",
            finish_reason="stop",
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            completion_tokens=0,
            **values,
        )
