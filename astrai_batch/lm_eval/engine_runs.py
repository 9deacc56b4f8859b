"""lm-eval's token-level requests as engine requests, run to completion on one `EngineCore`.

Pairs sharing a context become one scoring request (the context computed once, each
continuation forked from it); distinct contexts sharing a few-shot prefix meet in the prefix
cache, helped by submitting them in token order. The order and the grouping change no value:
with invariant numerics a request's logits never depend on what runs beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.tasks.scoring_types import ContinuationScore, ScoreRequest
from astrai_batch.engine.types import GenerationRequest, GenerationResult
from astrai_batch.errors import AstraiBatchError

Pair = tuple[tuple[int, ...], tuple[int, ...]]  # (context tokens, continuation tokens)


class EvaluationError(AstraiBatchError):
    """A request lm-eval asked for that the engine could not answer (its reason inside)."""


def run_to_completion(
    core: EngineCore,
    requests: Iterable[GenerationRequest],
    on_result: Callable[[GenerationResult], None] | None = None,
) -> dict[Hashable, list[GenerationResult]]:
    """Every request's results by request id (samples in index order); requests are fed while
    the engine's waiting list has room, as the async engine does."""
    results: dict[Hashable, list[GenerationResult]] = {}

    def keep(batch: list[GenerationResult]) -> None:
        for result in batch:
            if result.error is not None:
                raise EvaluationError(f"request {result.request_id!r}: {result.error}")
            results.setdefault(result.request_id, []).append(result)
            if on_result is not None:
                on_result(result)

    pending = iter(requests)
    exhausted = False
    capacity = core.config.waiting_capacity
    while True:
        while not exhausted and core.num_waiting < capacity:
            request = next(pending, None)
            if request is None:
                exhausted = True
                break
            keep(core.add_request(request))
        if core.num_unfinished == 0:
            if exhausted:
                break
            continue
        keep(core.step())
    for samples in results.values():
        samples.sort(key=lambda r: r.sample_index)
    return results


def truncate_pair(context: Sequence[int], continuation: Sequence[int], max_length: int) -> Pair:
    """lm-eval's left truncation: the model sees at most `max_length` tokens of
    context + continuation less its last token, so the context loses its first tokens."""
    if not continuation or len(continuation) > max_length:
        raise EvaluationError(
            f"a continuation of {len(continuation)} tokens cannot be scored within "
            f"{max_length} tokens"
        )
    excess = len(context) + len(continuation) - (max_length + 1)
    return tuple(context[max(excess, 0) :]), tuple(continuation)


def score_pairs(
    core: EngineCore,
    pairs: Sequence[Pair],
    *,
    adapter: str | None,
    on_pair: Callable[[int], None] | None = None,
) -> list[ContinuationScore]:
    """Each pair's score, in the pairs' order: one scoring request per distinct context
    (its distinct continuations), submitted in token order."""
    by_context: dict[tuple[int, ...], dict[tuple[int, ...], None]] = {}
    for context, continuation in pairs:
        by_context.setdefault(context, {})[continuation] = None
    contexts = sorted(by_context)
    requests = [
        GenerationRequest(
            request_id=number,
            prompt_token_ids=context,
            params=SamplingParams(max_tokens=1),
            adapter=adapter,
            score=ScoreRequest(tuple(by_context[context])),
        )
        for number, context in enumerate(contexts)
    ]

    def counted(result: GenerationResult) -> None:
        if on_pair is not None:
            on_pair(len(result.scores or ()))

    results = run_to_completion(core, requests, counted)
    scores: dict[Pair, ContinuationScore] = {}
    for number, context in enumerate(contexts):
        answer = results[number][0].scores or ()
        for continuation, score in zip(by_context[context], answer, strict=True):
            scores[(context, continuation)] = score
    return [scores[pair] for pair in pairs]
