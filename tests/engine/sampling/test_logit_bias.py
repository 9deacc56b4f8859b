"""OpenAI's logit_bias: added to the model's logits before penalties (checked against
transformers' penalty on biased logits), only in its own row, whatever the batch."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from astrai_batch.engine.request_checks import why_never_fits
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
from astrai_batch.engine.sampling.token_sampling import adjusted_scores, sample_next_tokens
from astrai_batch.errors import ConfigError

VOCAB = 256


def logits_of(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_bias_is_read_from_openais_object_and_checked() -> None:
    params = SamplingParams(logit_bias={"7": -100, 5: 10, "300": 0.5})
    assert params.logit_bias == ((5, 10.0), (7, -100.0), (300, 0.5))
    assert SamplingParams.from_dict(params.to_dict()) == params
    assert SamplingParams().replace(logit_bias={}).logit_bias == ()
    for value, message in [
        ({"x": 1}, "logit_bias keys must be token ids, got 'x'"),
        ({"-1": 1}, "logit_bias keys must be token ids, got '-1'"),
        ({"3": 101}, "logit_bias['3'] must be a number in [-100, 100], got 101"),
        ({"3": True}, "logit_bias['3'] must be a number in [-100, 100], got True"),
        ([1, 2], "logit_bias must be an object of token id: bias"),
        ("5", "logit_bias must be an object of token id: bias, got string"),
    ]:
        with pytest.raises(ConfigError) as error:
            SamplingParams(logit_bias=value)
        assert str(error.value) == message
    assert (
        why_never_fits(
            (1, 2),
            4,
            vocab_size=VOCAB,
            max_model_len=64,
            page_size=16,
            usable_pages=8,
            logit_bias=((3, 1.0), (VOCAB, 2.0)),
        )
        == f"logit_bias token id {VOCAB} is outside the vocabulary (size {VOCAB})"
    )


@pytest.mark.parametrize("penalty", [1.0, 1.4])
def test_bias_then_penalties_match_transformers(penalty: float) -> None:
    logits = logits_of(4, seed=3)
    bias = {2: 5.0, 9: -100.0, 40: 2.5}
    prompt = [[2, 9, 11], [40], [3, 4], [2]]
    samplers = [
        SequenceSampler(SamplingParams(logit_bias=bias, repetition_penalty=penalty), ids)
        for ids in prompt
    ]
    biased = logits.clone()
    for token, value in bias.items():
        biased[:, token] += value
    expected = torch.stack(
        [
            RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ids]), biased[row : row + 1])[0]
            if penalty != 1.0
            else biased[row]
            for row, ids in enumerate(prompt)
        ]
    )
    assert torch.equal(adjusted_scores(logits, samplers), expected)


def test_a_large_bias_decides_greedy_and_a_large_penalty_forbids() -> None:
    logits = logits_of(2, seed=4)
    best = logits.argmax(dim=-1).tolist()
    forced = SamplingParams(logit_bias={17: 100})
    banned = SamplingParams(logit_bias={best[1]: -100}, logprobs=True)
    tokens = sample_next_tokens(logits, [SequenceSampler(forced, []), SequenceSampler(banned, [])])
    second = logits[1].clone()
    second[best[1]] -= 100
    assert [t.token_id for t in tokens] == [17, int(second.argmax())]
    # the logprob is the raw distribution's, before the bias (as before penalties and masks:
    # docs/tasks.md), as vLLM's default raw logprobs are
    assert tokens[1].logprob == float(torch.log_softmax(logits[1], dim=-1)[second.argmax()])


def test_a_rows_bias_never_depends_on_its_batch() -> None:
    logits = logits_of(5, seed=5)
    params = [
        SamplingParams(logit_bias={1: 3.0}, temperature=0.8, seed=1, logprobs=True),
        SamplingParams(),
        SamplingParams(logit_bias={1: -3.0, 2: 50.0}, logprobs=True),
        SamplingParams(temperature=1.0, seed=2),
        SamplingParams(logit_bias={200: 7.5}, presence_penalty=0.5, logprobs=True),
    ]
    together = sample_next_tokens(logits, [SequenceSampler(p, [3, 4]) for p in params])
    for row, p in enumerate(params):
        alone = sample_next_tokens(logits[row : row + 1], [SequenceSampler(p, [3, 4])])
        assert alone == [together[row]]
