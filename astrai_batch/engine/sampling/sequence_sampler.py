"""One sequence's sampling state: its params, what it generated, and its random stream.

A sequence's stream is keyed by a seed from `(params.seed, sample_index)` when the request has
a seed, else from the `fallback_seed` the engine derives per sample, else from the OS (then
the sample is not reproducible). Draw k of a stream is a counter-based hash (SplitMix64's
finaliser) of (seed, k) computed on the host for all rows at once: no generator object and no
device round trip per row, and the same numbers on every device.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Collection, Sequence

import numpy as np
import torch

from astrai_batch.engine.sampling.params import SEED_LIMIT, SamplingParams


class SequenceSampler:
    """Sampling state of one sequence (one sample of one request)."""

    # slots: read for every running sequence every step (see Sequence)
    __slots__ = (
        "_draws",
        "_generated",
        "_num_generated",
        "_plain_greedy_from",
        "_prompt_ids",
        "early_stop_ids",
        "eos_token_ids",
        "has_penalties",
        "params",
        "sample_index",
        "seed",
    )

    def __init__(
        self,
        params: SamplingParams,
        prompt_token_ids: Sequence[int],
        *,
        sample_index: int = 0,
        eos_token_ids: Collection[int] = frozenset(),
        fallback_seed: int | None = None,
    ) -> None:
        if not 0 <= sample_index < params.n:
            raise ValueError(f"sample_index must be in [0, {params.n}), got {sample_index}")
        if fallback_seed is not None and not 0 <= fallback_seed < SEED_LIMIT:
            raise ValueError(f"fallback_seed must be in [0, 2**63), got {fallback_seed}")
        self.params = params
        self.sample_index = sample_index
        self.eos_token_ids = frozenset(eos_token_ids)
        early_stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            early_stops |= self.eos_token_ids
        self.early_stop_ids: tuple[int, ...] = tuple(sorted(early_stops))
        self.has_penalties = (
            params.repetition_penalty != 1.0
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
        )
        # `is_plain_greedy` (asked every step) as one comparison: from which generated token
        # on the next one is the raw logits' argmax (never with penalties, logprobs or
        # sampling; after min_tokens while that masks the tokens that would end the row)
        plain = (
            params.greedy
            and not self.has_penalties
            and not params.logprobs
            and not params.logit_bias
        )
        masked_until = params.min_tokens if self.early_stop_ids else 0
        self._plain_greedy_from = masked_until if plain else math.inf
        self._num_generated = 0
        # A preallocated tensor, so a step gathers all rows' history with one `torch.cat`.
        self._generated = (
            torch.empty(params.max_tokens, dtype=torch.long) if self.has_penalties else None
        )
        self._prompt_ids = torch.tensor(
            sorted(set(prompt_token_ids)) if params.repetition_penalty != 1.0 else [],
            dtype=torch.long,
        )
        self.seed = None if params.greedy else _sequence_seed(params, sample_index, fallback_seed)
        self._draws = 0  # uniforms drawn so far: the counter of the next draw

    @property
    def num_generated(self) -> int:
        return self._num_generated

    @property
    def masks_early_stops(self) -> bool:
        """True while min_tokens forbids the tokens that would end the sequence."""
        return self._num_generated < self.params.min_tokens and bool(self.early_stop_ids)

    @property
    def is_plain_greedy(self) -> bool:
        """True when the next token is exactly the argmax of the raw logits."""
        return self._num_generated >= self._plain_greedy_from

    def append(self, token_id: int) -> None:
        """Records a generated token (penalty counts, min_tokens progress)."""
        if token_id < 0:
            raise ValueError(f"token_id must be >= 0, got {token_id}")
        if self._generated is not None:
            if self._num_generated == len(self._generated):
                grown = torch.empty(2 * len(self._generated), dtype=torch.long)
                grown[: self._num_generated] = self._generated
                self._generated = grown
            self._generated[self._num_generated] = token_id
        self._num_generated += 1

    def generated_ids(self) -> torch.Tensor:
        """The generated ids (a view) when penalties need them, else an empty tensor."""
        if self._generated is None:
            return self._prompt_ids[:0]
        return self._generated[: self._num_generated]

    def penalised_ids(self) -> torch.Tensor:
        """The ids the repetition penalty applies to (prompt and generated, maybe repeated)."""
        if self.params.repetition_penalty == 1.0:
            return self._prompt_ids[:0]
        return torch.cat([self._prompt_ids, self.generated_ids()])

    def next_uniform(self) -> float:
        """One draw in [0, 1) from this sequence's stream."""
        return float(draw_uniforms([self])[0])

    def check_invariants(self) -> None:
        if self._num_generated < 0:
            raise ValueError(f"num_generated is negative: {self._num_generated}")
        if self._generated is not None and len(self._generated) < self._num_generated:
            raise ValueError("generated-id buffer is shorter than num_generated")
        if (self.seed is None) != self.params.greedy:
            raise ValueError("a sequence has a random stream exactly when it samples")


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def draw_uniforms(samplers: Sequence[SequenceSampler]) -> np.ndarray:
    """The next uniform in [0, 1) of each sampler's stream (float64), advancing each by one."""
    seeds = []
    counters = []
    for sampler in samplers:
        if sampler.seed is None:
            raise ValueError("greedy sequences draw no random numbers")
        seeds.append(sampler.seed)
        counters.append(sampler._draws)
        sampler._draws += 1
    with np.errstate(over="ignore"):
        z = np.array(seeds, dtype=np.uint64) + (np.array(counters, dtype=np.uint64) + 1) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _sequence_seed(params: SamplingParams, sample_index: int, fallback: int | None) -> int:
    if params.seed is not None:
        # Hash the pair rather than add: sample i of seed s must not replay sample 0 of s + i.
        digest = hashlib.blake2b(
            params.seed.to_bytes(8, "little") + sample_index.to_bytes(8, "little"),
            digest_size=8,
        ).digest()
        return int.from_bytes(digest, "little") % SEED_LIMIT
    if fallback is not None:
        return fallback
    return secrets.randbits(63)
