"""What a scoring request asks and what it answers (no torch: jobs build and read them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreRequest:
    """The continuations (token ids, each non-empty) scored after the request's prompt."""

    continuations: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.continuations or not all(self.continuations):
            raise ValueError("a score request needs continuations of at least one token")


@dataclass(frozen=True)
class ContinuationScore:
    """lm-eval's `loglikelihood` answer for one continuation, and its tokens' parts."""

    logprob: float  # the sum over the continuation's tokens
    num_tokens: int
    is_greedy: bool  # every token is the argmax given what precedes it
    token_logprobs: tuple[float, ...]


def score_problem(
    context: tuple[int, ...], request: ScoreRequest, *, vocab_size: int, max_model_len: int
) -> str | None:
    """The error of a scoring request that can never run, or None."""
    if not context:
        return "context is empty"
    for tokens in (context, *request.continuations):
        bad = next((t for t in tokens if t < 0 or t >= vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (size {vocab_size})"
    for number, tokens in enumerate(request.continuations):
        # the model sees every token but the continuation's last (its logits come from the
        # position before it): lm-eval's windows of max_length + 1 tokens fit exactly
        total = len(context) + len(tokens)
        if total - 1 > max_model_len:
            return (
                f"context ({len(context)} tokens) + continuations[{number}] ({len(tokens)} "
                f"tokens) - 1 = {total - 1} exceeds the model context of {max_model_len} tokens"
            )
    return None
