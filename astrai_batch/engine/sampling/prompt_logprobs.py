"""Log-probabilities at prompt positions: the logits of more than a sequence's last token.

A sequence with `PositionTargets` wants, for each position p in [lo, hi), the log-probability
of one or more target tokens under the logits computed at p (the model's distribution over
the token at p + 1), whether each target is the argmax there, and optionally the `top_n`
most likely tokens. Scoring uses it (a continuation's tokens given its context), and so do
prompt logprobs (every prompt token given the ones before it).

Positions are recorded by index, so a preempted sequence that recomputes them overwrites
them with the same values (invariant numerics: the same bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


class TokenLogprob(NamedTuple):
    """A target token at one position: its log-probability, its rank (1 + how many tokens
    are strictly more likely: vLLM's rank; 0 for a scoring target, which reports none),
    whether it is the argmax (ties: the lowest id,
    as torch's argmax), and the `top_n` most likely (token id, log-probability) pairs."""

    token_id: int
    logprob: float
    rank: int
    is_greedy: bool
    top: tuple[tuple[int, float], ...]


class PositionTargets:
    """What one sequence wants from its logits at positions [lo, hi).

    `targets[i]` are the token ids scored at position lo + i. `then_samples`: the sequence
    goes on to sample after its prompt (prompt logprobs of a generation: each target's rank is
    computed, whatever `top_n`, even 0); otherwise it ends once every position is scored
    (scoring, which reports no rank: its entries' rank is 0). Whether a rank is computed is
    the sequence's own choice, never its neighbours' in the step.
    """

    __slots__ = ("hi", "lo", "results", "targets", "then_samples", "top_n")

    def __init__(
        self,
        lo: int,
        targets: Sequence[tuple[int, ...]],
        *,
        top_n: int = 0,
        then_samples: bool = False,
    ) -> None:
        if lo < 0 or not targets:
            raise ValueError(f"position targets need lo >= 0 and targets, got {lo}, {targets}")
        self.lo = lo
        self.hi = lo + len(targets)
        self.targets = [tuple(t) for t in targets]
        self.top_n = top_n
        self.then_samples = then_samples
        self.results: list[tuple[TokenLogprob, ...] | None] = [None] * len(targets)

    def span_in(self, start: int, num_tokens: int) -> tuple[int, int] | None:
        """The rows of a chunk computing positions [start, start + num_tokens) that this
        sequence wants logits of, relative to the chunk, or None."""
        a = max(start, self.lo)
        b = min(start + num_tokens, self.hi)
        return (a - start, b - start) if a < b else None

    @property
    def complete(self) -> bool:
        return all(result is not None for result in self.results)


@dataclass(frozen=True)
class LogitRows:
    """Which sequence position each extra logits row of a step belongs to."""

    owners: list[PositionTargets]
    positions: list[int]


def record_rows(logits: torch.Tensor, rows: LogitRows) -> None:
    """Scores every row's targets and stores them in their owners: one log-softmax over all
    rows of the step, one gather of the targets, one top-k when any owner wants it."""
    if logits.shape[0] != len(rows.positions):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows.positions)} positions")
    if not rows.positions:
        return
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    row_of: list[int] = []
    target_ids: list[int] = []
    for row, (owner, position) in enumerate(zip(rows.owners, rows.positions, strict=True)):
        for token in owner.targets[position - owner.lo]:
            row_of.append(row)
            target_ids.append(token)
    device = logprobs.device
    row_index = torch.tensor(row_of, dtype=torch.long, device=device)
    targets = torch.tensor(target_ids, dtype=torch.long, device=device)
    picked = logprobs[row_index, targets]
    greedy = logprobs.argmax(dim=-1)[row_index] == targets
    top_n = max(owner.top_n for owner in rows.owners)
    if top_n:
        top_values, top_ids = torch.topk(logprobs, top_n, dim=-1)
        top_values, top_ids = top_values.cpu().tolist(), top_ids.cpu().tolist()
    # ranks of the targets whose owner reports them (prompt logprobs), only those: an entry's
    # rank never depends on which other sequences share the step
    ranked = [i for i, row in enumerate(row_of) if rows.owners[row].then_samples]
    ranks = [0] * len(row_of)
    if ranked:
        at = torch.tensor(ranked, dtype=torch.long, device=device)
        counts = (logprobs[row_index[at]] > picked[at][:, None]).sum(dim=-1) + 1
        for i, rank in zip(ranked, counts.cpu().tolist(), strict=True):
            ranks[i] = rank
    picked_host = picked.cpu().tolist()
    greedy_host = greedy.cpu().tolist()
    entry = 0
    for row, (owner, position) in enumerate(zip(rows.owners, rows.positions, strict=True)):
        scored = []
        n = owner.top_n
        top = tuple(zip(top_ids[row][:n], top_values[row][:n], strict=True)) if n else ()
        for token in owner.targets[position - owner.lo]:
            scored.append(
                TokenLogprob(token, picked_host[entry], ranks[entry], bool(greedy_host[entry]), top)
            )
            entry += 1
        owner.results[position - owner.lo] = tuple(scored)


def with_logit_spans(work: Sequence, chunks: list) -> tuple[list, LogitRows | None]:
    """The step's chunks with the `logit_span` of every sequence that wants prompt-position
    logits (a scoring sequence's last row is not a sampling row), and whose positions the
    extra logits rows are, in chunk order; the chunks unchanged when none wants any."""
    owners: list[PositionTargets] = []
    positions: list[int] = []
    out = chunks
    for i, item in enumerate(work):
        targets = item.seq.targets
        if targets is None:
            continue
        if out is chunks:
            out = list(chunks)
        chunk = chunks[i]
        span = targets.span_in(chunk.start, len(chunk.token_ids))
        wants = chunk.wants_logits and targets.then_samples
        out[i] = chunk._replace(logit_span=span, wants_logits=wants)
        if span is not None:
            first = chunk.start + span[0]
            count = span[1] - span[0]
            owners.extend([targets] * count)
            positions.extend(range(first, first + count))
    if out is chunks:
        return chunks, None
    return out, LogitRows(owners, positions)


def prompt_targets(prompt: Sequence[int], top_n: int | None) -> PositionTargets | None:
    """vLLM's prompt_logprobs: every prompt token but the first, scored at the position
    before it; None when not asked for (or a one-token prompt: nothing to score)."""
    if top_n is None or len(prompt) < 2:
        return None
    return PositionTargets(0, [(t,) for t in prompt[1:]], top_n=top_n, then_samples=True)


def prompt_results(targets: PositionTargets | None) -> tuple[TokenLogprob | None, ...] | None:
    """A generation's prompt logprobs: None for the first token, then each token's."""
    if targets is None or not targets.then_samples:
        return None
    return (None, *(result[0] for result in targets.results))  # type: ignore[index]


class TopLogprobRows(NamedTuple):
    """The raw log-softmax of a step's rows that report top_logprobs, taken before sampling."""

    rows: list[int]
    logprobs: torch.Tensor


def top_logprob_rows(seqs: Sequence, logits: torch.Tensor) -> TopLogprobRows | None:
    """The model's distribution (the raw logits' float32 log-softmax, before penalties,
    temperature and grammar masks, as vLLM's default `raw_logprobs` and OpenAI report it) of
    the rows that want top_logprobs. Taken before sampling: a constrained row's grammar mask
    is applied to `logits` in place (`token_sampling.adjusted_scores`)."""
    rows = [i for i, seq in enumerate(seqs) if seq.params.top_logprobs]
    if not rows:
        return None
    index = torch.tensor(rows, device=logits.device)
    return TopLogprobRows(rows, torch.log_softmax(logits[index].float(), dim=-1))


def record_top_logprobs(
    seqs: Sequence, top: TopLogprobRows | None, token_ids: Sequence[int]
) -> None:
    """OpenAI's top_logprobs of the tokens just sampled, from `top_logprob_rows`: the sampled
    token's logprob and rank, and the N most likely, all of the raw distribution."""
    if top is None:
        return
    rows, logprobs = top
    device = logprobs.device
    chosen = torch.tensor([token_ids[i] for i in rows], device=device)
    picked = logprobs[torch.arange(len(rows), device=device), chosen]
    ranks = ((logprobs > picked[:, None]).sum(dim=-1) + 1).tolist()
    greedy = (logprobs.argmax(dim=-1) == chosen).tolist()
    n = max(seqs[i].params.top_logprobs for i in rows)
    values, ids = torch.topk(logprobs, n, dim=-1)
    values, ids, picked_host = values.tolist(), ids.tolist(), picked.tolist()
    for k, i in enumerate(rows):
        seq = seqs[i]
        m = seq.params.top_logprobs
        top_m = tuple(zip(ids[k][:m], values[k][:m], strict=True))
        seq.top_logprobs.append(
            TokenLogprob(int(token_ids[i]), picked_host[k], ranks[k], bool(greedy[k]), top_m)
        )


def token_texts(tokenizer, *entry_lists) -> dict[int, str] | None:
    """Each token id named in the entries (and their alternatives), decoded alone."""
    ids: set[int] = set()
    for entries in entry_lists:
        for entry in entries or ():
            if entry is not None:
                ids.add(entry.token_id)
                ids.update(token for token, _ in entry.top)
    if not ids:
        return None
    ordered = sorted(ids)
    return dict(zip(ordered, tokenizer.batch_decode([[t] for t in ordered]), strict=True))
