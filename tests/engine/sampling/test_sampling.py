from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
from astrai_batch.engine.sampling.token_sampling import (
    SampledToken,
    adjusted_scores,
    filter_scores,
    sample_next_tokens,
)

VOCAB = 512


def random_logits(rows: int, seed: int, vocab: int = VOCAB, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator) * scale


def samplers_for(params: SamplingParams, rows: int, **kwargs) -> list[SequenceSampler]:
    return [SequenceSampler(params, [], **kwargs) for _ in range(rows)]


def draw_steps(
    samplers: list[SequenceSampler], logits_per_step: list[torch.Tensor]
) -> list[list[int]]:
    """Samples and records every step; returns the tokens of each row."""
    out: list[list[int]] = [[] for _ in samplers]
    for logits in logits_per_step:
        for row, sampled in enumerate(sample_next_tokens(logits, samplers)):
            samplers[row].append(sampled.token_id)
            out[row].append(sampled.token_id)
    return out


# -- greedy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype: torch.dtype) -> None:
    logits = random_logits(16, seed=1).to(dtype)
    tokens = sample_next_tokens(logits, samplers_for(SamplingParams(), 16))
    assert tokens == [SampledToken(t, None) for t in torch.argmax(logits, dim=-1).tolist()]


def test_greedy_rows_are_argmax_when_mixed_with_sampled_and_logprob_rows() -> None:
    logits = random_logits(6, seed=2)
    samplers = [
        SequenceSampler(SamplingParams(), []),
        SequenceSampler(SamplingParams(temperature=1.0, seed=1), []),
        SequenceSampler(SamplingParams(logprobs=True), []),
        SequenceSampler(SamplingParams(temperature=0.5, top_k=3, seed=2), []),
        SequenceSampler(SamplingParams(), []),
        SequenceSampler(SamplingParams(min_tokens=1), [], eos_token_ids={7}),
    ]
    tokens = sample_next_tokens(logits, samplers)
    argmax = torch.argmax(logits, dim=-1).tolist()
    for row in (0, 2, 4):
        assert tokens[row].token_id == argmax[row]
    if argmax[5] != 7:
        assert tokens[5].token_id == argmax[5]


def test_input_logits_are_not_modified() -> None:
    logits = random_logits(3, seed=3)
    before = logits.clone()
    params = SamplingParams(
        temperature=0.9, top_k=5, top_p=0.8, min_p=0.1, repetition_penalty=1.5, min_tokens=2
    )
    samplers = [SequenceSampler(params, [1, 2, 3], eos_token_ids={4}, fallback_seed=9)] * 3
    sample_next_tokens(logits, samplers)
    assert torch.equal(logits, before)


def test_logits_shape_must_match_samplers() -> None:
    with pytest.raises(ValueError) as raised:
        sample_next_tokens(random_logits(2, seed=0), samplers_for(SamplingParams(), 3))
    assert str(raised.value) == "logits must have shape [3, vocab], got [2, 512]"


# -- penalties ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_transformers(seed: int, penalty: float) -> None:
    rows, prompt_len, generated_len = 8, 24, 12
    generator = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, VOCAB, (rows, prompt_len + generated_len), generator=generator)
    logits = random_logits(rows, seed=seed)
    # Each row's best token (runner-up when the penalty rewards) was just generated, so the
    # penalty changes the greedy choice of some rows.
    ids[:, -1] = torch.topk(logits, 2).indices[:, 0 if penalty > 1 else 1]
    samplers = []
    for row in range(rows):
        sampler = SequenceSampler(
            SamplingParams(repetition_penalty=penalty), ids[row, :prompt_len].tolist()
        )
        for token in ids[row, prompt_len:].tolist():
            sampler.append(token)
        samplers.append(sampler)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    assert torch.equal(adjusted_scores(logits, samplers), expected)
    tokens = [t.token_id for t in sample_next_tokens(logits, samplers)]
    assert tokens == torch.argmax(expected, dim=-1).tolist()
    assert tokens != torch.argmax(logits, dim=-1).tolist()


def test_penalised_greedy_on_bfloat16_logits_is_computed_in_float32() -> None:
    logits = random_logits(4, seed=5).to(torch.bfloat16)
    ids = torch.topk(logits.float(), 1).indices
    samplers = []
    for row in range(4):
        sampler = SequenceSampler(SamplingParams(repetition_penalty=1.5), [])
        sampler.append(int(ids[row, 0]))
        samplers.append(sampler)
    expected = RepetitionPenaltyLogitsProcessor(1.5)(ids, logits.float())
    tokens = [t.token_id for t in sample_next_tokens(logits, samplers)]
    assert tokens == torch.argmax(expected, dim=-1).tolist()


def test_repetition_penalty_ignores_ids_outside_the_logits_vocab() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 4.0]])
    sampler = SequenceSampler(SamplingParams(repetition_penalty=2.0), [0, 9])
    sampler.append(1)
    sampler.append(12)
    expected = torch.tensor([[1.0, -2.0, 0.5, 4.0]])
    assert torch.equal(adjusted_scores(logits, [sampler]), expected)


def test_presence_and_frequency_penalties_count_generated_tokens_only() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    sampler = SequenceSampler(params, [0, 3])
    for token in (1, 1, 2):
        sampler.append(token)
    expected = torch.tensor([[1.0, 2.0 - 1.0 - 0.25, -1.0 - 0.5 - 0.25, 0.5]])
    assert torch.equal(adjusted_scores(logits, [sampler]), expected)


def test_repetition_then_presence_and_frequency() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    sampler = SequenceSampler(params, [3])
    for token in (1, 1, 2):
        sampler.append(token)
    expected = torch.tensor([[1.0, 1.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 0.25]])
    assert torch.equal(adjusted_scores(logits, [sampler]), expected)


def test_penalties_apply_only_to_their_rows() -> None:
    logits = random_logits(3, seed=4)
    plain = SequenceSampler(SamplingParams(), [1, 2])
    penalised = SequenceSampler(SamplingParams(repetition_penalty=1.5, presence_penalty=1.0), [1])
    penalised.append(2)
    scores = adjusted_scores(logits, [plain, penalised, plain])
    assert torch.equal(scores[0], logits[0])
    assert torch.equal(scores[2], logits[2])
    changed = (scores[1] != logits[1]).nonzero().flatten().tolist()
    assert changed == [1, 2]


def test_penalty_history_survives_more_tokens_than_max_tokens() -> None:
    sampler = SequenceSampler(SamplingParams(max_tokens=2, frequency_penalty=1.0), [])
    for token in (3, 3, 3, 1):
        sampler.append(token)
    sampler.check_invariants()
    scores = adjusted_scores(torch.zeros(1, 4), [sampler])
    assert scores.tolist() == [[0.0, -1.0, 0.0, -3.0]]


# -- min_tokens --------------------------------------------------------------------------------


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    eos, stop_id, fallback = 5, 6, 4
    logits = torch.zeros(1, 8)
    logits[0, eos] = 3.0
    logits[0, stop_id] = 2.0
    logits[0, fallback] = 1.0
    params = SamplingParams(min_tokens=2, stop_token_ids=(stop_id,))
    sampler = SequenceSampler(params, [], eos_token_ids={eos})
    assert draw_steps([sampler], [logits] * 3) == [[fallback, fallback, eos]]


def test_min_tokens_with_ignore_eos_masks_only_stop_ids() -> None:
    eos, stop_id = 5, 6
    logits = torch.zeros(1, 8)
    logits[0, stop_id] = 3.0
    logits[0, eos] = 2.0
    params = SamplingParams(min_tokens=1, stop_token_ids=(stop_id,), ignore_eos=True)
    sampler = SequenceSampler(params, [], eos_token_ids={eos})
    assert draw_steps([sampler], [logits] * 2) == [[eos, stop_id]]


def test_min_tokens_masking_applies_to_sampled_rows() -> None:
    eos = 1
    logits = torch.tensor([[0.0, 50.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0, min_tokens=20, seed=5)
    sampler = SequenceSampler(params, [], eos_token_ids={eos})
    tokens = draw_steps([sampler], [logits] * 21)[0]
    assert eos not in tokens[:20]
    assert tokens[20] == eos


# -- filters -----------------------------------------------------------------------------------


def hf_filtered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """What transformers' warpers (in generate's order) leave of `logits`."""
    scores = logits.clone()
    if params.temperature != 1.0:
        scores = TemperatureLogitsWarper(params.temperature)(None, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    if params.min_p:
        scores = MinPLogitsWarper(params.min_p)(None, scores)
    return scores


FILTER_SETTINGS = [
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=0.7, top_k=50),
    SamplingParams(temperature=1.0, top_k=VOCAB + 10),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=0.5, top_p=0.3),
    SamplingParams(temperature=1.0, top_p=0.999),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=2.0, min_p=0.3),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
    SamplingParams(temperature=1.1, top_k=100, top_p=0.5),
    SamplingParams(temperature=1.0),
]


@pytest.mark.parametrize("seed", [10, 11, 12, 13])
@pytest.mark.parametrize("params", FILTER_SETTINGS, ids=repr)
def test_filters_keep_what_transformers_keeps(seed: int, params: SamplingParams) -> None:
    logits = random_logits(8, seed=seed)
    samplers = samplers_for(params, 8, fallback_seed=0)
    scaled = logits / params.temperature
    kept = filter_scores(scaled, samplers) != float("-inf")
    expected = hf_filtered(logits, params) != float("-inf")
    assert torch.equal(kept, expected)


@pytest.mark.parametrize("seed", [20, 21])
def test_filters_with_different_settings_per_row(seed: int) -> None:
    logits = random_logits(len(FILTER_SETTINGS), seed=seed)
    samplers = [SequenceSampler(params, [], fallback_seed=0) for params in FILTER_SETTINGS]
    temperatures = torch.tensor([[params.temperature] for params in FILTER_SETTINGS])
    kept = filter_scores(logits / temperatures, samplers) != float("-inf")
    for row, params in enumerate(FILTER_SETTINGS):
        expected = hf_filtered(logits[row : row + 1], params) != float("-inf")
        assert torch.equal(kept[row : row + 1], expected), params


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.7, [True, True, False, False, False]),
        # Exactly reachable: 0.5 + 0.25 == 0.75, so no third token is needed.
        (0.75, [True, True, False, False, False]),
        (0.76, [True, True, True, False, False]),
        (0.01, [True, False, False, False, False]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p: float, expected: list) -> None:
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]).log()
    sampler = SequenceSampler(SamplingParams(temperature=1.0, top_p=top_p), [], fallback_seed=0)
    kept = filter_scores(logits, [sampler]) != float("-inf")
    assert kept.tolist() == [expected]
    assert kept.tolist() == (TopPLogitsWarper(top_p)(None, logits) != float("-inf")).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_top_p_drops_tied_tokens_lowest_id_first(seed: int) -> None:
    """Where the cut falls inside a run of equal logits (common with bfloat16 models), the
    tied tokens are dropped in token-id order: a brute force over the (value, id) order."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 6, (16, 64), generator=generator).float() * 0.5
    top_p = 0.3 + 0.1 * seed
    sampler = SequenceSampler(SamplingParams(temperature=1.0, top_p=top_p), [], fallback_seed=0)
    kept = filter_scores(logits, [sampler] * 16) != float("-inf")
    cut_inside_a_tie = 0
    for row in range(16):
        values = logits[row].tolist()
        order = sorted(range(64), key=lambda i: (values[i], i))
        ascending = torch.tensor([values[i] for i in order])
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        dropped = {order[j] for j in range(63) if cumulative[j] <= 1 - top_p}
        assert kept[row].tolist() == [i not in dropped for i in range(64)]
        smallest_kept = min(values[i] for i in range(64) if i not in dropped)
        cut_inside_a_tie += any(values[i] == smallest_kept for i in dropped)
    assert cut_inside_a_tie > 0  # the case the rule decides did occur


def test_draws_stay_inside_the_kept_set() -> None:
    logits = random_logits(1, seed=30, scale=0.5)
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    sampler = SequenceSampler(SamplingParams(temperature=1.0, top_k=3, seed=1), [])
    tokens = draw_steps([sampler], [logits] * 300)[0]
    assert set(tokens) == top3


def test_draws_never_pick_dropped_tokens_at_the_end_of_the_vocab() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0, 3.0, 3.0, 3.0]])
    logits[0, 4:] = float("-inf")
    sampler = SequenceSampler(SamplingParams(temperature=1.0, top_k=2, seed=8), [])
    assert set(draw_steps([sampler], [logits] * 200)[0]) == {0, 1}


def test_draw_frequencies_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None, :]
    sampler = SequenceSampler(SamplingParams(temperature=1.0, seed=2024), [])
    draws = 4000
    counts = Counter(draw_steps([sampler], [logits] * draws)[0])
    for token, p in enumerate(probs.tolist()):
        # Five standard deviations: fixed seed, so this is an exact check of one outcome
        # that only a wrong sampler would fail.
        assert abs(counts[token] / draws - p) < 5 * math.sqrt(p * (1 - p) / draws), counts


# -- seeds and reproducibility -----------------------------------------------------------------


def test_seeded_draws_do_not_depend_on_the_batch() -> None:
    steps = 50
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    target_logits = [random_logits(1, seed=1000 + s, scale=1.0) for s in range(steps)]
    alone = draw_steps([SequenceSampler(params, [5, 6])], target_logits)[0]

    others = [
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=1.2, top_k=20, seed=2),
        SamplingParams(),
        SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.2, seed=3),
        SamplingParams(temperature=0.5, logprobs=True, seed=4),
        SamplingParams(repetition_penalty=1.4),
        SamplingParams(temperature=1.0, top_p=0.5),
    ]
    position = 5
    samplers = [SequenceSampler(p, [1, 2, 3], fallback_seed=77) for p in others]
    samplers.insert(position, SequenceSampler(params, [5, 6]))
    batched_logits = []
    for step in range(steps):
        rows = random_logits(8, seed=5000 + step, scale=1.0)
        rows[position] = target_logits[step][0]
        batched_logits.append(rows)
    in_batch = draw_steps(samplers, batched_logits)[position]
    assert in_batch == alone
    assert len(set(alone)) > 10


def sample_path(params: SamplingParams, sample_index: int = 0, **kwargs) -> list[int]:
    logits = [random_logits(1, seed=s, scale=0.5) for s in range(20)]
    sampler = SequenceSampler(params, [], sample_index=sample_index, **kwargs)
    return draw_steps([sampler], logits)[0]


def test_same_seed_same_tokens_distinct_seeds_differ() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    assert sample_path(params) == sample_path(params)
    assert sample_path(params) != sample_path(params.replace(seed=8))


def test_samples_of_one_seed_differ_from_each_other() -> None:
    params = SamplingParams(n=4, temperature=1.0, seed=7)
    paths = [sample_path(params, sample_index=i) for i in range(4)]
    assert len({tuple(path) for path in paths}) == 4
    # Sample 1 of seed 7 is not sample 0 of seed 8.
    assert paths[1] != sample_path(params.replace(seed=8))


def test_fallback_seed_is_used_only_without_a_request_seed() -> None:
    unseeded = SamplingParams(temperature=1.0)
    assert sample_path(unseeded, fallback_seed=5) == sample_path(unseeded, fallback_seed=5)
    assert sample_path(unseeded, fallback_seed=5) != sample_path(unseeded, fallback_seed=6)
    seeded = SamplingParams(temperature=1.0, seed=3)
    assert sample_path(seeded, fallback_seed=5) == sample_path(seeded, fallback_seed=6)


def test_greedy_samplers_have_no_seed() -> None:
    sampler = SequenceSampler(SamplingParams(seed=3), [], fallback_seed=4)
    assert sampler.seed is None
    sampler.check_invariants()
    with pytest.raises(ValueError) as raised:
        sampler.next_uniform()
    assert str(raised.value) == "greedy sequences draw no random numbers"


def test_sampler_argument_validation() -> None:
    with pytest.raises(ValueError) as raised:
        SequenceSampler(SamplingParams(n=2), [], sample_index=2)
    assert str(raised.value) == "sample_index must be in [0, 2), got 2"
    with pytest.raises(ValueError) as raised:
        SequenceSampler(SamplingParams(), [], fallback_seed=-1)
    assert str(raised.value) == "fallback_seed must be in [0, 2**63), got -1"
    with pytest.raises(ValueError) as raised:
        SequenceSampler(SamplingParams(), []).append(-3)
    assert str(raised.value) == "token_id must be >= 0, got -3"


def test_num_generated_counts_appends() -> None:
    sampler = SequenceSampler(SamplingParams(min_tokens=2), [], eos_token_ids={0})
    assert sampler.masks_early_stops
    sampler.append(3)
    sampler.append(4)
    assert sampler.num_generated == 2
    assert not sampler.masks_early_stops
    sampler.check_invariants()


# -- logprobs ----------------------------------------------------------------------------------


def test_greedy_logprob_is_log_softmax_at_the_argmax() -> None:
    logits = random_logits(4, seed=40)
    samplers = samplers_for(SamplingParams(logprobs=True), 4)
    tokens = sample_next_tokens(logits, samplers)
    expected = torch.log_softmax(logits, dim=-1)
    for row, sampled in enumerate(tokens):
        assert sampled.token_id == int(torch.argmax(logits[row]))
        assert sampled.logprob == expected[row, sampled.token_id].item()


def test_sampled_logprob_is_of_the_raw_distribution_whatever_the_temperature() -> None:
    logits = random_logits(3, seed=41)
    params = SamplingParams(temperature=0.5, top_k=4, logprobs=True, seed=9)
    samplers = [SequenceSampler(params, [], sample_index=0)] * 3
    tokens = sample_next_tokens(logits, samplers)
    expected = torch.log_softmax(logits, dim=-1)
    for row, sampled in enumerate(tokens):
        assert sampled.logprob == expected[row, sampled.token_id].item()


def test_logprob_ignores_penalties_and_masks() -> None:
    """The penalties and the min_tokens mask choose token 0 (token 2, the argmax, is an end
    token under min_tokens; token 1 is penalised); its logprob is the raw model's."""
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    params = SamplingParams(logprobs=True, repetition_penalty=2.0, min_tokens=1)
    sampler = SequenceSampler(params, [1], eos_token_ids={2})
    (sampled,) = sample_next_tokens(logits, [sampler])
    expected = torch.log_softmax(logits[0], dim=-1)
    assert sampled.token_id == 0
    assert sampled.logprob == expected[0].item()


def test_logprobs_are_none_unless_requested() -> None:
    logits = random_logits(2, seed=42)
    samplers = [
        SequenceSampler(SamplingParams(temperature=1.0, seed=1), []),
        SequenceSampler(SamplingParams(temperature=1.0, seed=1, logprobs=True), []),
    ]
    first, second = sample_next_tokens(logits, samplers)
    assert first.logprob is None
    assert second.logprob is not None


# -- against transformers generate --------------------------------------------------------------


def greedy_loop(model, prompt: list[int], params: SamplingParams, eos: int) -> list[int]:
    sampler = SequenceSampler(params, prompt, eos_token_ids={eos})
    ids = list(prompt)
    for _ in range(params.max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1, :]
        (sampled,) = sample_next_tokens(logits, [sampler])
        sampler.append(sampled.token_id)
        ids.append(sampled.token_id)
    return ids[len(prompt) :]


def test_greedy_with_penalty_and_min_tokens_matches_generate(tiny_llama_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    prompt = [5, 17, 42, 99, 7, 42, 5]
    new = 24
    params = SamplingParams(max_tokens=new, min_tokens=new, repetition_penalty=1.3)
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            repetition_penalty=1.3,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=eos,
        )[0, len(prompt) :].tolist()
    assert greedy_loop(model, prompt, params, eos) == expected
    assert greedy_loop(model, prompt, params.replace(repetition_penalty=1.0), eos) != expected


def splitmix64_reference(seed: int, counter: int) -> float:
    """SplitMix64's finaliser of seed + (counter + 1) * golden gamma, in Python integers."""
    mask = (1 << 64) - 1
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 11) / 2.0**53


def test_uniform_draws_are_splitmix64_of_seed_and_draw_count() -> None:
    from astrai_batch.engine.sampling.sequence_sampler import draw_uniforms

    samplers = [
        SequenceSampler(SamplingParams(temperature=1.0), [], fallback_seed=seed)
        for seed in (0, 1, 2**62 + 12345)
    ]
    first = draw_uniforms(samplers)
    second = draw_uniforms(samplers[::-1])[::-1]  # order in the batch does not matter
    for row, sampler in enumerate(samplers):
        assert first[row] == splitmix64_reference(sampler.seed, 0)
        assert second[row] == splitmix64_reference(sampler.seed, 1)
    assert samplers[0].next_uniform() == splitmix64_reference(samplers[0].seed, 2)


def test_row_argmax_is_torch_argmax_ties_included() -> None:
    from astrai_batch.engine.sampling.token_sampling import row_argmax

    logits = random_logits(64, seed=9)
    logits[:, 5] = logits.max(dim=-1).values  # every row: a tie between column 5 and another
    logits[3] = 1.0  # a row that is all ties
    assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(row_argmax(logits.double()), logits.double().argmax(dim=-1))
    half = logits.to(torch.bfloat16)  # numpy has no bfloat16: torch's own argmax
    assert torch.equal(row_argmax(half), half.argmax(dim=-1))
