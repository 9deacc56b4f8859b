"""Choosing the next token of every running sequence, once per engine step.

`sample_next_tokens` turns the last-position logits of N sequences into N tokens. Each row is
processed in this order, always in float32:

1. `logit_bias` (OpenAI's), added to the model's logits (`logit_bias`). Then penalties.
   `repetition_penalty` (Hugging Face semantics, the same arithmetic as
   `RepetitionPenaltyLogitsProcessor`): every token seen in the prompt or the output so far has
   its logit divided by the penalty when positive and multiplied by it when negative, once
   however often it occurred. Then `frequency_penalty * count + presence_penalty` is subtracted
   from every token generated `count >= 1` times (OpenAI semantics: the prompt does not count).
2. The grammar masks of constrained rows (`engine.constraints`): every token the row's
   grammar does not allow next gets -inf, so greedy and seeded rows both choose from the
   constrained distribution (the logprobs reported stay the raw ones: step 5).
   Then min_tokens. While fewer than `min_tokens` tokens were generated, the `stop_token_ids`
   and the EOS ids get -inf, so the sequence cannot end early. With `ignore_eos` EOS does not
   end a sequence, so it is not masked (only the stop ids are). The grammar wins over
   min_tokens (as in vLLM): when a constrained output is complete and its grammar allows
   nothing but end tokens, they stay allowed, so the row ends there, shorter than
   min_tokens, rather than with a token its grammar forbids.
3. Greedy rows (temperature 0) take the argmax (the first maximal index, as `torch.argmax`;
   computed by numpy on CPU, several times faster there): of the raw logits when
   no penalty or mask applies, and of the penalised logits otherwise.
4. Other rows are divided by the temperature, then filtered like Hugging Face's warpers, in
   their order: top-k (keep logits >= the k-th largest), top-p (drop the tokens whose
   ascending cumulative probability is <= 1 - top_p; the top token always stays), min-p (drop
   tokens whose probability is < min_p * the top probability). The token is drawn by inverse
   CDF: one uniform number per step from the sequence's own stream, so a sequence's tokens
   never depend on the other rows of the batch or their order.
5. `logprob`, when requested, is the model's raw distribution at the chosen token: the
   float32 `log_softmax` of the row's logits as the model gave them, before penalties, grammar
   masks, min_tokens, temperature and truncation (vLLM's default `raw_logprobs`; OpenAI
   reports the model's logprobs whatever the sampling settings). It is read before step 2 can
   mask the logits in place, so a constrained row's logprob is the raw one too, the same
   value its `top_logprobs` entry carries (`prompt_logprobs.record_top_logprobs`).

Each sequence's state and random stream are a `SequenceSampler` (`sequence_sampler`).

Only rows that need it pay for it: an all-greedy batch without penalties, masks or logprobs is
one `argmax`; penalties cost time in the number of prompt and generated ids, not the vocab.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.sampling.logit_bias import add_logit_bias
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler, draw_uniforms

if TYPE_CHECKING:
    from astrai_batch.engine.sampling.constraints.mask_filler import StepMasks


class SampledToken(NamedTuple):
    """A named tuple: one per sequence per step."""

    token_id: int
    logprob: float | None


def sample_next_tokens(
    logits: torch.Tensor, samplers: Sequence[SequenceSampler], masks: StepMasks | None = None
) -> list[SampledToken]:
    """`sample_token_ids`, a `SampledToken` per row."""
    token_ids, logprobs = sample_token_ids(logits, samplers, masks)
    if logprobs is None:
        return [SampledToken(token, None) for token in token_ids]
    return [SampledToken(t, v) for t, v in zip(token_ids, logprobs, strict=True)]


def sample_token_ids(
    logits: torch.Tensor, samplers: Sequence[SequenceSampler], masks: StepMasks | None = None
) -> tuple[list[int], list[float | None] | None]:
    """One token per row of `logits` ([N, vocab], the last-position logits of each sequence),
    and each row's logprob (None for rows that did not ask; no list when none did).

    `masks` holds the grammar masks of the constrained rows; they are applied in place to the
    float32 scores, which are `logits` itself when those are float32 and need no penalty (the
    engine's logits are a per-step temporary). Does not record the tokens: the caller passes
    each one to `SequenceSampler.append`.
    """
    if logits.dim() != 2 or logits.shape[0] != len(samplers):
        raise ValueError(
            f"logits must have shape [{len(samplers)}, vocab], got {list(logits.shape)}"
        )
    if masks is None and all(sampler.is_plain_greedy for sampler in samplers):
        return row_argmax(logits).tolist(), None
    wants = [sampler.params.logprobs for sampler in samplers]
    # the raw distribution, before the masks of step 2 may overwrite `logits` in place
    raw = raw_logprobs(logits, [i for i, want in enumerate(wants) if want])
    scores = adjusted_scores(logits, samplers, masks)
    device = scores.device
    token_ids = torch.empty(len(samplers), dtype=torch.long, device=device)
    logprobs = torch.full((len(samplers),), float("nan"), device=device)
    greedy = [i for i, sampler in enumerate(samplers) if sampler.params.greedy]
    drawn = [i for i, sampler in enumerate(samplers) if not sampler.params.greedy]
    if greedy:
        greedy_scores = _rows(scores, greedy)
        chosen = row_argmax(greedy_scores)
        token_ids[_index(greedy, device)] = chosen
    if drawn:
        drawn_samplers = [samplers[i] for i in drawn]
        scaled = _rows(scores, drawn) / _column(drawn_samplers, "temperature", device)
        chosen = _draw(filter_scores(scaled, drawn_samplers), drawn_samplers)
        token_ids[_index(drawn, device)] = chosen
    if raw is None:
        return token_ids.tolist(), None
    wanted = _index([i for i, want in enumerate(wants) if want], device)
    logprobs[wanted] = raw.gather(1, token_ids[wanted][:, None])[:, 0]
    # one read from the device for both (float64 holds every token id exactly)
    host = torch.stack([token_ids.double(), logprobs.double()]).cpu()
    tokens, values = host[0].long().tolist(), host[1].tolist()
    return tokens, [value if want else None for value, want in zip(values, wants, strict=True)]


def raw_logprobs(logits: torch.Tensor, rows: list[int]) -> torch.Tensor | None:
    """The float32 log-softmax of the given rows of the model's logits (a new tensor: later
    in-place masking of `logits` leaves it alone), or None for no rows."""
    if not rows:
        return None
    return torch.log_softmax(_rows(logits, rows).float(), dim=-1)


def row_argmax(scores: torch.Tensor) -> torch.Tensor:
    """The first index of each row's maximum. On CPU numpy's argmax (measured 16x faster than
    torch's at 256 x 384 and 6x at 256 x 49,152, one thread); both return the first maximum."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(scores.numpy().argmax(axis=-1))
    return scores.argmax(dim=-1)


def adjusted_scores(
    logits: torch.Tensor, samplers: Sequence[SequenceSampler], masks: StepMasks | None = None
) -> torch.Tensor:
    """Float32 logits after the penalties, the grammar masks and the min_tokens mask (steps
    1-2). A new tensor whenever a penalty or min_tokens applies; grammar masks alone are
    applied in place to float32 `logits` (the engine's are a per-step temporary)."""
    penalised = [s for s in samplers if s.has_penalties]
    masked = [i for i, sampler in enumerate(samplers) if sampler.masks_early_stops]
    biased = any(sampler.params.logit_bias for sampler in samplers)
    if not penalised and not masked and not biased:
        scores = logits.float()
        if masks is not None:
            masks.apply(scores)
        return scores
    scores = logits.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    vocab = scores.shape[1]
    flat = scores.view(-1)
    if biased:
        add_logit_bias(flat, samplers, vocab)
    if any(s.params.repetition_penalty != 1.0 for s in penalised):
        rows, ids = _flatten([s.penalised_ids() for s in samplers], vocab)
        at = (rows * vocab + ids).to(scores.device)
        seen = flat[at]
        penalty = _column(samplers, "repetition_penalty", scores.device)[rows.to(scores.device), 0]
        # Gather, then scatter: each seen token is penalised once however often it occurs.
        flat[at] = torch.where(seen < 0, seen * penalty, seen / penalty)
    if any(
        s.params.frequency_penalty != 0.0 or s.params.presence_penalty != 0.0 for s in penalised
    ):
        rows, ids = _flatten([s.generated_ids() for s in samplers], vocab)
        at, counts = torch.unique(rows * vocab + ids, return_counts=True)
        owner = at // vocab
        frequency = torch.tensor([s.params.frequency_penalty for s in samplers])[owner]
        presence = torch.tensor([s.params.presence_penalty for s in samplers])[owner]
        flat[at.to(scores.device)] -= (counts * frequency + presence).to(scores.device)
    if masks is not None:
        masks.apply(scores)
    if masked:
        _mask_early_stops(scores, samplers, masked, masks.rows if masks is not None else ())
    return scores


def _mask_early_stops(
    scores: torch.Tensor,
    samplers: Sequence[SequenceSampler],
    masked: list[int],
    constrained: Collection[int],
) -> None:
    """-inf for the end tokens of the rows still under min_tokens, except in constrained rows
    whose grammar allows nothing else (a complete output: the grammar wins)."""
    vocab = scores.shape[1]
    pairs = [(row, t) for row in masked for t in samplers[row].early_stop_ids if t < vocab]
    if not pairs:
        return
    rows = _index([row for row, _ in pairs], scores.device)
    tokens = _index([t for _, t in pairs], scores.device)
    kept = scores[rows, tokens]
    scores[rows, tokens] = float("-inf")
    checked = sorted(set(masked).intersection(constrained))
    if not checked:
        return  # an unconstrained row always keeps the rest of its vocabulary
    emptied = scores[_index(checked, scores.device)].amax(dim=1) == float("-inf")
    if bool(emptied.any()):
        empty_rows = {row for row, empty in zip(checked, emptied.tolist(), strict=True) if empty}
        restore = [i for i, (row, _) in enumerate(pairs) if row in empty_rows]
        at = _index(restore, scores.device)
        scores[rows[at], tokens[at]] = kept[at]


def filter_scores(scaled: torch.Tensor, samplers: Sequence[SequenceSampler]) -> torch.Tensor:
    """Applies each row's top-k, top-p and min-p (in that order) to temperature-scaled scores;
    dropped tokens get -inf. Rows whose filter is off pass through that filter unchanged."""
    vocab = scaled.shape[1]
    device = scaled.device
    top_ks = [min(sampler.params.top_k, vocab) for sampler in samplers]
    if any(top_ks):
        kth_largest = torch.topk(scaled, max(top_ks), dim=-1).values
        positions = _index([max(k, 1) - 1 for k in top_ks], device)
        thresholds = kth_largest.gather(1, positions[:, None])
        off = HostStaging(device).values([k == 0 for k in top_ks], torch.bool)[:, None]
        thresholds = thresholds.masked_fill(off, float("-inf"))
        scaled = scaled.masked_fill(scaled < thresholds, float("-inf"))
    if any(sampler.params.top_p < 1.0 for sampler in samplers):
        # 1 - top_p in double precision, then rounded, as transformers computes it; -1 keeps
        # every token of rows without top-p.
        cutoffs = HostStaging(device).values(
            [1.0 - s.params.top_p if s.params.top_p < 1.0 else -1.0 for s in samplers],
            torch.float32,
        )[:, None]
        scaled = scaled.masked_fill(_top_p_drop(scaled, cutoffs), float("-inf"))
    if any(sampler.params.min_p > 0.0 for sampler in samplers):
        probs = scaled.softmax(dim=-1)
        floor = _column(samplers, "min_p", device) * probs.amax(dim=-1, keepdim=True)
        drop = probs < floor
        drop.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def _top_p_drop(scaled: torch.Tensor, cutoffs: torch.Tensor) -> torch.Tensor:
    """True for the tokens top-p drops: those whose ascending cumulative probability is <=
    the row's cutoff (the top token always stays), computed over the ascending values exactly
    as transformers does.

    On the GPU, one sort with its permutation, as transformers. On the CPU torch's sort of a
    [256, 49,152] float32 matrix takes 0.8 s (the step's largest cost with any sampling row)
    while numpy's vectorized sort of the values alone takes 0.05 s. The dropped tokens are an
    ascending prefix, so the values alone say how many (k) and the value at which they stop;
    only where that value ties with kept tokens does it matter which are dropped: the lowest
    token ids first (torch's own sort leaves the order of ties unspecified).
    """
    if scaled.device.type != "cpu" or scaled.dtype != torch.float32:
        ascending, order = torch.sort(scaled, descending=False)
        drop_sorted = ascending.softmax(dim=-1).cumsum(dim=-1) <= cutoffs
        drop_sorted[:, -1] = False
        return drop_sorted.scatter(1, order, drop_sorted)
    ascending = torch.from_numpy(np.sort(scaled.numpy(), axis=-1))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    # the dropped prefix (the cumulative sum only grows), by bisection rather than by
    # counting a [rows, vocab] mask; the top token always stays
    dropped = torch.searchsorted(cumulative, cutoffs, right=True).clamp_(max=scaled.shape[1] - 1)
    first_kept = ascending.gather(1, dropped)
    drop = scaled < first_kept
    below = torch.searchsorted(ascending, first_kept)  # how many values lie below it
    ties = (dropped - below)[:, 0]  # tokens equal to it that are dropped too
    for row in torch.nonzero(ties).flatten().tolist():
        tied = torch.nonzero(scaled[row] == first_kept[row]).flatten()
        drop[row, tied[: int(ties[row])]] = True
    return drop


def _draw(filtered: torch.Tensor, samplers: Sequence[SequenceSampler]) -> torch.Tensor:
    # Inverse CDF in float64. Normalising by the last entry makes it exactly 1 > u, so the
    # first entry above u always exists and is a token of positive probability (a dropped
    # token repeats its left neighbour's CDF value and can never be the first one above u).
    cdf = torch.softmax(filtered, dim=-1, dtype=torch.float64).cumsum_(dim=-1)
    cdf /= cdf[:, -1:].clone()
    uniforms = torch.from_numpy(draw_uniforms(samplers))
    return torch.searchsorted(cdf, uniforms.to(cdf.device)[:, None], right=True)[:, 0]


def _flatten(per_row: list[torch.Tensor], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, id) pairs of ragged per-row id tensors, ids outside [0, vocab) dropped."""
    lengths = torch.tensor([len(ids) for ids in per_row], dtype=torch.long)
    ids = torch.cat(per_row)
    rows = torch.repeat_interleave(torch.arange(len(per_row)), lengths)
    if len(ids) == 0 or (int(ids.min()) >= 0 and int(ids.max()) < vocab):
        return rows, ids
    inside = (ids >= 0) & (ids < vocab)
    return rows[inside], ids[inside]


def _rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    if len(rows) == tensor.shape[0]:
        return tensor
    return tensor[_index(rows, tensor.device)]


def _column(samplers: Sequence[SequenceSampler], field: str, device: torch.device) -> torch.Tensor:
    values = [getattr(sampler.params, field) for sampler in samplers]
    return HostStaging(device).values(values, torch.float32)[:, None]


def _index(positions: list[int], device: torch.device) -> torch.Tensor:
    # pinned and non-blocking: a pageable copy would wait for the step's forward
    return HostStaging(device).values(positions, torch.long)
