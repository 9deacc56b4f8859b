"""Tokenizing `--task score` rows as lm-evaluation-harness does (`_encode_pair`).

Trailing whitespace of the context moves to the front of every continuation; the context is
encoded alone and `context + continuation` whole, both without added special tokens; the
continuation's tokens are what follows the first `len(encode(context))` tokens of the whole.
A chat context is rendered with the chat template first (with the generation prompt): the
rendered text stands for the context. The context's own tokens (not the whole's prefix) are
what the engine computes, exactly as lm-eval feeds `context_enc + continuation_enc`.

An empty context (`""`) follows lm-eval's `loglikelihood`: the context is the one token
`prefix_token_id` (the tokenizer's BOS, else its EOS/EOT token) and each continuation is
encoded alone, without special tokens, so its first token is scored after that token. A
context of whitespace only is refused: lm-eval moves the whitespace into the continuation and
is left with no context token to score its first token after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from astrai_batch.io import InputRow
from astrai_batch.jobs.planning.tokenize import Encoding, PromptEncoder


@dataclass(frozen=True)
class ScorePair:
    """A score row's context tokens and each continuation's tokens, or its error."""

    context: tuple[int, ...] | None
    continuations: tuple[tuple[int, ...], ...] | None
    error: str | None = None


def encode_pairs(encoder: PromptEncoder, rows: Sequence[InputRow]) -> list[ScorePair]:
    """One `ScorePair` per row (rows with an error keep it)."""
    return [_encode_row(encoder, row) for row in rows]


def _encode_row(encoder: PromptEncoder, row: InputRow) -> ScorePair:
    if row.error is not None:
        return ScorePair(None, None, row.error)
    if row.messages is not None:
        rendered = encoder.render_chat(row)
        if isinstance(rendered, Encoding):
            return ScorePair(None, None, rendered.error)
        context = rendered
    elif row.prompt is not None:
        context = row.prompt
    else:
        return ScorePair(None, None, "a --task score context must be text or messages")
    tokenizer = encoder.tokenizer
    if context == "":
        return _after_prefix_token(tokenizer, row.continuations or ())
    stripped = context.rstrip()
    moved = context[len(stripped) :]
    if not stripped:
        return ScorePair(None, None, "context is only whitespace")
    texts = [stripped] + [stripped + moved + text for text in row.continuations or ()]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    context_ids = tuple(int(t) for t in encoded[0])
    if not context_ids:
        return ScorePair(None, None, "context is empty after tokenization")
    continuations = []
    for number, whole in enumerate(encoded[1:]):
        tokens = tuple(int(t) for t in whole[len(context_ids) :])
        if not tokens:
            return ScorePair(None, None, f"continuations[{number}] has no tokens after the context")
        continuations.append(tokens)
    return ScorePair(context_ids, tuple(continuations))


def prefix_token_id(tokenizer) -> int | None:
    """lm-eval's `prefix_token_id`: what an empty context stands for (BOS, else EOS)."""
    if tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    return None


def _after_prefix_token(tokenizer, continuations: Sequence[str]) -> ScorePair:
    prefix = prefix_token_id(tokenizer)
    if prefix is None:
        return ScorePair(
            None, None, "context is empty and the tokenizer has no BOS or EOS token to stand for it"
        )
    encoded = tokenizer(list(continuations), add_special_tokens=False)["input_ids"]
    tokens = []
    for number, ids in enumerate(encoded):
        if not ids:
            return ScorePair(None, None, f"continuations[{number}] has no tokens after the context")
        tokens.append(tuple(int(t) for t in ids))
    return ScorePair((prefix,), tuple(tokens))


def score_encodings(
    encoder: PromptEncoder, rows: Sequence[InputRow], encodings: list[Encoding]
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Replaces, in place, the encoding of every score row (a row with continuations) by
    its context's `_encode_pair` tokens or its error; returns each score row's
    continuations by position."""
    out: dict[int, tuple[tuple[int, ...], ...]] = {}
    for position, row in enumerate(rows):
        if row.continuations is None or row.error is not None:
            continue
        pair = _encode_row(encoder, row)
        if pair.error is not None:
            encodings[position] = Encoding(error=pair.error)
        else:
            encodings[position] = Encoding(token_ids=pair.context)
            out[position] = pair.continuations  # type: ignore[assignment]
    return out
