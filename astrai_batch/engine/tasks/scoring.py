"""Scoring requests: the log-likelihood of each continuation given one context, no decode.

A scoring request (`GenerationRequest.score`) runs as a tree of sequences:

- the *context* sequence computes the context (its leading pages from the prefix cache as
  any prompt's) and keeps the logits of its last position, which score the first token of
  every continuation;
- once it is computed, each continuation of two or more tokens becomes a *branch* sequence,
  forked from the context: it opens the context's full pages from the prefix index (the
  context published them), gets a copy of the context's last, partial page, and computes
  only its own tokens but the last, scoring continuation tokens 2.. at those positions.

So a context is computed once per row, a few-shot prefix shared by rows once per job (the
prefix cache), and each continuation costs its own tokens less one. Without a prefix cache
(or in the contiguous layout) a branch is an ordinary sequence over context + continuation
that recomputes the context: the same numbers, more work.

A branch that is preempted comes back as an ordinary sequence (prefix cache, then the
context's partial page recomputed): same values, since positions are recorded by index.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from astrai_batch.cache import KVPool
from astrai_batch.cache.layout import KVLayout
from astrai_batch.engine.sampling.prompt_logprobs import PositionTargets
from astrai_batch.engine.scheduler import ScheduledWork, Scheduler
from astrai_batch.engine.sequences.sequence import Sequence
from astrai_batch.engine.tasks.scoring_types import ContinuationScore, ScoreRequest


class _Group:
    __slots__ = ("branches", "cached_tokens", "context_len", "first", "pending", "request_id")

    def __init__(self, request_id: Hashable, context_len: int, num_branches: int) -> None:
        self.request_id = request_id
        self.context_len = context_len
        self.first: list = [None] * num_branches  # TokenLogprob of each first token
        self.branches: list = [()] * num_branches  # TokenLogprobs of tokens 2..
        self.pending = 0
        self.cached_tokens = 0


NewSequence = Callable[[Hashable, tuple[int, ...], PositionTargets], Sequence]


class ScoreGroups:
    """The scoring requests in flight: their context and branch sequences, and results."""

    def __init__(
        self,
        scheduler: Scheduler,
        cache: KVLayout,
        pool: KVPool,
        new_sequence: NewSequence,
    ) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.pool = pool
        self.new_sequence = new_sequence
        self._groups: dict[int, tuple[_Group, int, ScoreRequest | None]] = {}
        self.forked = 0  # branches that started from a copy of the context's pages

    @property
    def active(self) -> bool:
        return bool(self._groups)

    def add(self, request_id: Hashable, context: tuple[int, ...], request: ScoreRequest) -> None:
        group = _Group(request_id, len(context), len(request.continuations))
        firsts = tuple(tokens[0] for tokens in request.continuations)
        seq = self.new_sequence(request_id, context, PositionTargets(len(context) - 1, [firsts]))
        group.pending = 1
        self._groups[seq.seq_id] = (group, -1, request)
        self.scheduler.add(seq)

    def after_step(self, work: list[ScheduledWork]) -> list[tuple]:
        """Finishes the scoring sequences this step completed; returns (request id, context
        tokens, cached tokens, continuation scores) of each request now complete."""
        done = []
        for seq, _ in work:
            entry = self._groups.get(seq.seq_id)
            if entry is None or seq.num_computed < len(seq.tokens):
                continue
            group, branch, request = entry
            del self._groups[seq.seq_id]
            results = seq.targets.results  # type: ignore[union-attr]
            if branch < 0:
                group.first = list(results[0])  # type: ignore[index]
                group.cached_tokens = seq.cached_tokens or 0
                self._branch_out(seq, group, request)  # type: ignore[arg-type]
            else:
                group.branches[branch] = tuple(r[0] for r in results)  # type: ignore[index]
            self.scheduler.finish(seq)
            group.pending -= 1
            if group.pending == 0:
                done.append(
                    (group.request_id, group.context_len, group.cached_tokens, _scores(group))
                )
        return done

    def _branch_out(self, context: Sequence, group: _Group, request: ScoreRequest) -> None:
        length = len(context.tokens)
        for number, tokens in enumerate(request.continuations):
            if len(tokens) < 2:
                continue
            targets = PositionTargets(length, [(t,) for t in tokens[1:]])
            seq = self.new_sequence(group.request_id, (*context.tokens, *tokens[:-1]), targets)
            self._groups[seq.seq_id] = (group, number, None)
            group.pending += 1
            if self._fork(context, seq):
                self.forked += 1
                self.scheduler.adopt(seq)
            else:
                self.scheduler.add(seq)

    def _fork(self, context: Sequence, branch: Sequence) -> bool:
        """Opens `branch` on the context's computed tokens: full pages shared through the
        prefix index, the partial one copied. False when it cannot (no prefix cache, or no
        free page now); the branch then runs as an ordinary sequence."""
        cache = self.cache
        if not cache.caches_prefixes:
            return False
        length = len(context.tokens)
        hit = cache.open(
            branch.seq_id, branch.tokens, length, count_lookup=False, namespace=branch.adapter
        )
        if not cache.reserve(branch.seq_id, length):
            cache.close(branch.seq_id)
            return False
        page = cache.page_size
        source = cache.pages(context.seq_id)
        target = cache.pages(branch.seq_id)
        first = hit // page
        count = -(-length // page) - first
        if count:
            _copy_pages(self.pool, source[first : first + count], target[first : first + count])
        branch.num_computed = length
        branch.cached_tokens = hit
        return True


def _copy_pages(pool: KVPool, source: list[int], target: list[int]) -> None:
    page = pool.page_size
    device = pool.key_cache[0].device
    offsets = torch.arange(page, device=device)
    src = (torch.tensor(source, device=device)[:, None] * page + offsets).reshape(-1)
    dst = (torch.tensor(target, device=device)[:, None] * page + offsets).reshape(-1)
    for cache in (*pool.key_cache, *pool.value_cache):
        cache.index_copy_(0, dst, cache.index_select(0, src))


def _scores(group: _Group) -> tuple[ContinuationScore, ...]:
    out = []
    for first, rest in zip(group.first, group.branches, strict=True):
        tokens = (first, *rest)
        values = tuple(t.logprob for t in tokens)
        out.append(
            ContinuationScore(
                logprob=float(sum(values)),
                num_tokens=len(tokens),
                is_greedy=all(t.is_greedy for t in tokens),
                token_logprobs=values,
            )
        )
    return tuple(out)
