"""lm-eval's tokenization of an empty scoring context (`TemplateLM.loglikelihood`): the
context is `[prefix_token_id]`, the tokenizer's BOS or, without one, its EOS/EOT token, and
each continuation is encoded alone without special tokens."""

from __future__ import annotations

import copy

from astrai_batch.io import InputRow
from astrai_batch.jobs.planning.score_pairs import ScorePair, encode_pairs
from astrai_batch.jobs.planning.tokenize import PromptEncoder

CONTINUATIONS = (" four", "Paris")


def pair(tokenizer, context: str) -> ScorePair:
    row = InputRow(index=0, id="r", prompt=context, continuations=CONTINUATIONS)
    (encoded,) = encode_pairs(PromptEncoder(tokenizer, "tiny"), [row])
    return encoded


def alone(tokenizer) -> tuple[tuple[int, ...], ...]:
    ids = tokenizer(list(CONTINUATIONS), add_special_tokens=False)["input_ids"]
    return tuple(tuple(x) for x in ids)


def test_empty_context_is_the_bos_token(tiny_tokenizer):
    assert tiny_tokenizer.bos_token_id is not None
    assert pair(tiny_tokenizer, "") == ScorePair(
        (tiny_tokenizer.bos_token_id,), alone(tiny_tokenizer)
    )


def test_empty_context_is_the_eos_token_without_bos(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.bos_token = None
    assert tokenizer.bos_token_id is None
    assert pair(tokenizer, "") == ScorePair((tokenizer.eos_token_id,), alone(tokenizer))


def test_no_special_token_and_whitespace_only_contexts_are_row_errors(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.bos_token = None
    tokenizer.eos_token = None
    assert pair(tokenizer, "").error == (
        "context is empty and the tokenizer has no BOS or EOS token to stand for it"
    )
    assert pair(tiny_tokenizer, " \n").error == "context is only whitespace"
