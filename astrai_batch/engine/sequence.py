"""One sequence (one sample of one request) as the scheduler and the engine core see it."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable

from astrai_batch.cache.page_keys import prefix_page_hashes
from astrai_batch.engine.sampling import SequenceSampler
from astrai_batch.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens, progress and sampling state of one sample.

    `num_computed` counts the tokens whose keys and values are in the pool; the tokens after it
    (the rest of the prompt, or the last sampled token) are what the next chunk computes.
    A preempted sequence drops to `num_computed == 0` and keeps its output and sampler, so its
    recompute continues with exactly the tokens it would have produced.
    """

    def __init__(
        self,
        *,
        seq_id: int,
        request_id: Hashable,
        sample_index: int,
        prompt_token_ids: tuple[int, ...],
        params: SamplingParams,
        sampler: SequenceSampler,
        arrival: int,
        page_size: int,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.sample_index = sample_index
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.sampler = sampler
        self.arrival = arrival
        self.tokens: list[int] = list(prompt_token_ids)
        self.num_computed = 0
        self.cached_tokens: int | None = None  # set at first admission
        self.logprobs: list[float] = []
        self.status = SequenceStatus.WAITING
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.admissions_waited = 0
        self.was_preempted = False
        self._page_hashes = prefix_page_hashes(prompt_token_ids, page_size)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    def prompt_page_hash(self, page_index: int) -> int | None:
        """A hash identifying the prompt's first `page_index + 1` full pages, or None past them."""
        if page_index < len(self._page_hashes):
            return self._page_hashes[page_index]
        return None
