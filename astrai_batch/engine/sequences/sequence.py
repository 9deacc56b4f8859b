"""One sequence (one sample of one request) as the scheduler and the engine core see it."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable

from astrai_batch.cache.page_keys import prefix_page_hashes
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.prompt_logprobs import PositionTargets
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler


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

    # slots: every step reads a few attributes of every running sequence, right after a
    # forward has swept the caches; slots keep them in the object itself, not in a dict
    __slots__ = (
        "_page_hashes",
        "adapter",
        "admissions_waited",
        "admitted_at",
        "arrival",
        "cached_tokens",
        "ends_by_text_or_grammar",
        "first_token_at",
        "images",
        "length_limit",
        "logprobs",
        "num_computed",
        "params",
        "prompt_token_ids",
        "request_id",
        "sample_index",
        "sampler",
        "seq_id",
        "status",
        "submitted_at",
        "targets",
        "tokens",
        "top_logprobs",
        "was_preempted",
    )

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
        max_model_len: int | None = None,
        adapter: int = 0,
        images: tuple = (),
    ) -> None:
        self.seq_id = seq_id
        self.images = images  # the request's images (`ImageInput`), in prompt order
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
        # the LoRA adapter slot (0: the base); also the namespace of its cached pages
        self.adapter = adapter
        self._page_hashes = prefix_page_hashes(prompt_token_ids, page_size, adapter)
        # What the engine checks after each token, decided once: the length at which the
        # sequence ends, and whether anything besides a token id (a stop string, a grammar)
        # can end it. A token that is neither an early stop id nor at the limit, in a
        # sequence without either, cannot end it.
        limit = len(prompt_token_ids) + params.max_tokens
        self.length_limit = limit if max_model_len is None else min(limit, max_model_len)
        self.ends_by_text_or_grammar = bool(params.stop) or params.constraint is not None
        # prompt positions whose logits are wanted (scoring, prompt logprobs), or None
        self.targets: PositionTargets | None = None
        self.top_logprobs: list = []  # TokenLogprob per generated token (top_logprobs)

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
    def cache_limit(self) -> int:
        """How many leading tokens may come from the prefix cache: all but the last, and
        none from the first position whose logits are wanted on (they must be computed)."""
        limit = len(self.tokens) - 1
        return limit if self.targets is None else min(limit, self.targets.lo)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    def prompt_page_hash(self, page_index: int) -> int | None:
        """A hash identifying the prompt's first `page_index + 1` full pages, or None past them."""
        if page_index < len(self._page_hashes):
            return self._page_hashes[page_index]
        return None
