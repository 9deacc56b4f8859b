"""Predicted prefill of `--task score` and `--task embed` jobs: what `astrai-batch plan`
reports for them, counted the way `run` computes.

Score (`engine/tasks/scoring.py`): a row's context runs as a prompt does, its leading full pages
from the prefix cache, so the contexts' prefill is the page-granular ideal of `prefix_stats`
over the contexts (few-shot prefixes shared across rows are computed once). The context's
last logits score every continuation's first token; a continuation of n >= 2 tokens then
forks from the context and computes its own tokens but the last: n - 1. So

    predicted = contexts' tokens to prefill + sum over continuations of (n - 1)

Two yardsticks beside it: scoring each (context, continuation) pair alone with one forward
(lm-evaluation-harness's HF backend) computes `len(context) + n - 1` tokens per pair; the
ideal computes every token of every pair's model input, `(context + continuation)[:-1]`,
once: the distinct nodes of their token prefix tree (no page granularity, no last token
recomputed). Not modelled: a later row whose context extends an earlier row's context and
continuation may also reuse that branch's published pages (`run` can only compute less).

Embed (`engine/tasks/embedding.py`): last-token pooling needs only the last position, so the rest
may come from the prefix cache: the page-granular ideal, as for generation. Mean and cls
pooling want every position's (or the first one's) hidden state and compute every prompt
token, shared or not.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.jobs.planning.prefix_stats import PrefixStats, PrefixStatsBuilder

_TOKEN_BYTES = 4


def _packed(tokens: Sequence[int]) -> bytes:
    """Big-endian uint32 bytes: their byte order is the token ids' lexicographic order."""
    packed = array("I", tokens)
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


def _common_tokens(a: bytes, b: bytes) -> int:
    """Leading tokens two packed sequences share (binary search over slice equality)."""
    low, high = 0, min(len(a), len(b)) // _TOKEN_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        end = middle * _TOKEN_BYTES
        if a[:end] == b[:end]:
            low = middle
        else:
            high = middle - 1
    return low


def distinct_prefix_tokens(sequences: Iterable[Sequence[int]]) -> int:
    """Nodes of the token prefix tree of `sequences`: each distinct (prefix, token) once."""
    return _distinct_packed([_packed(tokens) for tokens in sequences])


def _distinct_packed(packed: list[bytes]) -> int:
    """In sorted order each sequence adds the tokens past its common prefix with the one
    before: the tree's new nodes."""
    total = 0
    previous = b""
    for current in sorted(packed):
        total += len(current) // _TOKEN_BYTES - _common_tokens(previous, current)
        previous = current
    return total


def ideal_score_tokens(rows: Iterable[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> int:
    """Each token of every pair's model input `(context + continuation)[:-1]`, once."""
    return distinct_prefix_tokens(
        (*context, *continuation)[:-1]
        for context, continuations in rows
        for continuation in continuations
    )


@dataclass(frozen=True)
class ScorePrefill:
    """Prefill of a `--task score` input (see the module doc)."""

    contexts: PrefixStats  # the contexts as prompts: rows, tokens, shared prefixes
    pairs: int  # (context, continuation) pairs
    continuation_tokens: int
    branch_tokens: int  # sum of (continuation tokens - 1): what the forked branches compute
    pair_alone_tokens: int  # one forward per pair: sum of len(context) + n - 1
    predicted_prefill_tokens: int  # contexts' unique tokens + branch_tokens
    ideal_prefill_tokens: int  # distinct tokens of every pair's model input

    @property
    def predicted_over_ideal(self) -> float:
        return self.predicted_prefill_tokens / self.ideal_prefill_tokens if self.pairs else 0.0

    @property
    def saving_over_pairs_alone(self) -> float:
        if not self.pair_alone_tokens:
            return 0.0
        return 1.0 - self.predicted_prefill_tokens / self.pair_alone_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "context_tokens": self.contexts.prompt_tokens,
            "reusable_context_tokens": self.contexts.reusable_tokens,
            "continuation_tokens": self.continuation_tokens,
            "branch_tokens": self.branch_tokens,
            "pair_alone_tokens": self.pair_alone_tokens,
            "predicted_prefill_tokens": self.predicted_prefill_tokens,
            "ideal_prefill_tokens": self.ideal_prefill_tokens,
            "predicted_over_ideal": self.predicted_over_ideal,
            "saving_over_pairs_alone": self.saving_over_pairs_alone,
        }


class ScorePrefillBuilder:
    """Streams score rows (context tokens, continuations' tokens) into a `ScorePrefill`.

    The ideal needs every pair's model input at once (a global sort): it keeps them packed,
    4 bytes a token."""

    def __init__(self, page_size: int, top: int = 10) -> None:
        self._contexts = PrefixStatsBuilder(page_size, top)
        self._inputs: list[bytes] = []
        self._pairs = 0
        self._continuation_tokens = 0
        self._pair_alone_tokens = 0

    def add(self, context: Sequence[int], continuations: Sequence[Sequence[int]]) -> None:
        self._contexts.add(context)
        for continuation in continuations:
            self._pairs += 1
            self._continuation_tokens += len(continuation)
            self._pair_alone_tokens += len(context) + len(continuation) - 1
            self._inputs.append(_packed((*context, *continuation)[:-1]))

    def result(self) -> ScorePrefill:
        contexts = self._contexts.result()
        branch_tokens = self._continuation_tokens - self._pairs
        ideal = _distinct_packed(self._inputs)
        return ScorePrefill(
            contexts=contexts,
            pairs=self._pairs,
            continuation_tokens=self._continuation_tokens,
            branch_tokens=branch_tokens,
            pair_alone_tokens=self._pair_alone_tokens,
            predicted_prefill_tokens=contexts.unique_tokens + branch_tokens,
            ideal_prefill_tokens=ideal,
        )


@dataclass(frozen=True)
class EmbedPrefill:
    """Prefill of a `--task embed` input under its pooling (see the module doc)."""

    pooling: str
    prompts: PrefixStats

    @property
    def uses_prefix_cache(self) -> bool:
        return self.pooling == "last"

    @property
    def predicted_prefill_tokens(self) -> int:
        if self.uses_prefix_cache:
            return self.prompts.unique_tokens
        return self.prompts.prompt_tokens

    @property
    def predicted_prefill_saving(self) -> float:
        return self.prompts.predicted_prefill_saving if self.uses_prefix_cache else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pooling": self.pooling,
            "uses_prefix_cache": self.uses_prefix_cache,
            "predicted_prefill_tokens": self.predicted_prefill_tokens,
            "predicted_prefill_saving": self.predicted_prefill_saving,
            "last_pooling_prefill_tokens": self.prompts.unique_tokens,
        }
