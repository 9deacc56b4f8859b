"""Constrained decoding with the tiny model: outputs obey their constraint (checked by
jsonschema and `re`, not by our code), one compile per distinct constraint, bad constraints
fail their own row, preemption and neighbours change nothing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from engine_reference import hf_greedy, mixed_prompts

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.config import EngineConfig as Config
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.sampling.constraints import Constraint

CONFIG = EngineConfig(page_size=8, num_pages=256, max_num_seqs=16)
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["spam", "ham"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["label", "score"],
}
CHOICES = ["yes", "no", 'say "maybe"', "naïve"]
REGEX = r"[0-9]{3}-[a-z]{2,5}"


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    # shared prefixes: constrained rows also run as cascade groups over cached pages
    return mixed_prompts(len(tiny_tokenizer), seed=3, count=8, shared=True)


def params(constraint, *, seed=None, n=1, max_tokens=48, **extra):
    temperature = 0.0 if seed is None else 1.0
    return SamplingParams(
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        constraint=constraint,
        **extra,
    )


def check_output(constraint: Constraint, text: str) -> None:
    if constraint.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(constraint.text))
    elif constraint.kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif constraint.kind == "choice":
        assert text in constraint.choices
    elif constraint.kind == "grammar":  # the grammar of KINDS, as a regex
        assert re.fullmatch(r"\([a-c]+\)", text), text
    else:
        assert re.fullmatch(constraint.text, text), text


KINDS = [
    Constraint.json_schema(SCHEMA),
    Constraint("json_object"),
    Constraint.choice(CHOICES),
    Constraint("regex", REGEX),
    Constraint("grammar", 'root ::= "(" [a-c]+ ")"'),
]


def test_every_finished_completion_obeys_its_constraint(loaded, prompts):
    requests = []
    for i, prompt in enumerate(prompts):
        for k, constraint in enumerate(KINDS):
            for seed in (None, 10 + i):
                requests.append(
                    GenerationRequest((i, k, seed), prompt, params(constraint, seed=seed, n=2))
                )
        requests.append(GenerationRequest((i, "free", None), prompt, SamplingParams(max_tokens=8)))
    results, stats = generate_sync(loaded, requests, CONFIG)
    finished = {kind: 0 for kind in range(len(KINDS))}
    for result in results:
        _, k, _ = result.request_id
        if k == "free" or result.finish_reason == "length":
            continue
        assert result.finish_reason == "stop"
        assert result.token_ids[-1] in loaded.eos_token_ids
        check_output(KINDS[k], result.text)
        finished[k] += 1
    # a random model still completes most short constrained outputs
    assert all(count >= 4 for count in finished.values()), finished
    assert stats.grammars_compiled == len(KINDS)
    assert stats.constrained_requests == len(KINDS) * 2 * len(prompts)
    assert stats.mask_fill_seconds > 0


def test_one_compile_for_many_rows_sharing_a_constraint(loaded, prompts):
    schema_again = Constraint("json_schema", json.dumps(SCHEMA, separators=(",", ":")))
    requests = [
        GenerationRequest(i, prompts[i % len(prompts)], params(schema_again if i % 2 else KINDS[0]))
        for i in range(24)
    ]
    results, stats = generate_sync(loaded, requests, CONFIG)
    assert stats.grammars_compiled == 1
    assert stats.constrained_requests == 24
    assert all(r.error is None for r in results)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (
            Constraint("regex", "(ab"),
            "invalid regex: Regex parsing error at position 4: The parenthesis is not closed.",
        ),
        (
            Constraint("grammar", "root ::= missing"),
            "invalid grammar: EBNF parser error at line 1, column 10: "
            'Rule "missing" is not defined',
        ),
        (
            Constraint.json_schema({"type": "strin"}),
            'invalid json_schema: Unsupported type "strin"',
        ),
    ],
)
def test_a_bad_constraint_fails_its_own_row_only(loaded, prompts, constraint, message):
    requests = [
        GenerationRequest("before", prompts[0], params(KINDS[2])),
        GenerationRequest("bad", prompts[1], params(constraint, n=2)),
        GenerationRequest("bad-again", prompts[2], params(constraint)),
        GenerationRequest("after", prompts[3], SamplingParams(max_tokens=4)),
    ]
    results, stats = generate_sync(loaded, requests, CONFIG)
    by_id = {(r.request_id, r.sample_index): r for r in results}
    for key in (("bad", 0), ("bad", 1), ("bad-again", 0)):
        assert (by_id[key].finish_reason, by_id[key].error) == ("error", message)
    assert by_id[("before", 0)].error is None and by_id[("after", 0)].error is None
    assert stats.requests_failed == 3
    assert stats.constrained_requests == 3  # requests, not samples
    assert stats.grammars_compiled == 2  # the good one and the bad one, each once


def test_preemption_under_constraints_gives_identical_output(loaded, prompts):
    requests = [
        GenerationRequest(i, prompt, params(KINDS[i % len(KINDS)], seed=i if i % 2 else None))
        for i, prompt in enumerate(prompts)
    ]
    roomy, roomy_stats = generate_sync(loaded, requests, CONFIG)
    tight, tight_stats = generate_sync(
        loaded, requests, Config(page_size=8, num_pages=40, max_num_seqs=8)
    )
    assert roomy_stats.preemptions == 0 and tight_stats.preemptions > 0
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy]


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(loaded, prompts):
    free = [
        GenerationRequest(f"f{i}", p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)
    ]
    seeded = [
        GenerationRequest(f"s{i}", p, SamplingParams(max_tokens=12, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    alone, _ = generate_sync(loaded, free + seeded, CONFIG)
    constrained = [
        GenerationRequest(f"c{i}", p, params(KINDS[i % len(KINDS)])) for i, p in enumerate(prompts)
    ]
    mixed, _ = generate_sync(loaded, constrained + free + seeded, CONFIG)
    assert [r.token_ids for r in mixed[len(constrained) :]] == [r.token_ids for r in alone]


def test_length_cut_and_stop_strings_still_apply(loaded, prompts):
    cut = GenerationRequest(
        "cut", prompts[0], params(Constraint("regex", "[a-z]{50}"), max_tokens=3)
    )
    stopped = GenerationRequest(
        "stop", prompts[1], params(Constraint("regex", "(ab)+c(ab)+"), max_tokens=60, stop=("c",))
    )
    results, _ = generate_sync(loaded, [cut, stopped], CONFIG)
    assert (results[0].finish_reason, results[0].completion_tokens) == ("length", 3)
    assert results[1].finish_reason == "stop"
    assert re.fullmatch("(ab)+", results[1].text), results[1].text


def test_a_complete_grammar_ends_the_row_even_with_ignore_eos(loaded, prompts):
    request = GenerationRequest(
        "r", prompts[0], params(Constraint.choice(["ok"]), ignore_eos=True, max_tokens=20)
    )
    results, _ = generate_sync(loaded, [request], CONFIG)
    assert (results[0].text, results[0].finish_reason) == ("ok", "stop")


def hf_constrained(loaded, prompt, constraint, *, min_tokens, max_tokens):
    """transformers `generate` with `min_new_tokens` and xgrammar's own logits processor: the
    reference is not our code (greedy, float32; the tiny model's EOS ids are our engine's)."""
    import xgrammar
    from xgrammar.contrib.hf import LogitsProcessor

    info = xgrammar.TokenizerInfo.from_huggingface(
        loaded.tokenizer,
        vocab_size=loaded.model.config.vocab_size,
        stop_token_ids=sorted(loaded.eos_token_ids),
    )
    compiled = xgrammar.GrammarCompiler(info).compile_regex(constraint.text)
    processors = lambda _: [LogitsProcessor(compiled)]  # noqa: E731
    out = hf_greedy(loaded.source, [prompt], max_tokens, processors, min_new_tokens=min_tokens)
    return tuple(out[0])


def test_min_tokens_holds_off_a_complete_grammars_end_like_transformers(loaded, prompts):
    """While the grammar could go on, min_tokens masks the end token, as
    generate(min_new_tokens=...) does beside xgrammar's processor, token for token."""
    constraint = Constraint("regex", "[a-c]+")
    lengthened = 0
    for prompt in prompts:
        free, _ = generate_sync(loaded, [GenerationRequest(0, prompt, params(constraint))], CONFIG)
        ended = free[0].completion_tokens  # its EOS included
        if free[0].finish_reason != "stop" or ended > 20:
            continue
        min_tokens = ended + 3
        request = GenerationRequest(0, prompt, params(constraint, min_tokens=min_tokens))
        results, _ = generate_sync(loaded, [request], CONFIG)
        want = hf_constrained(loaded, prompt, constraint, min_tokens=min_tokens, max_tokens=48)
        assert results[0].token_ids == want
        assert results[0].completion_tokens > min_tokens
        assert re.fullmatch("[a-c]+", results[0].text), results[0].text
        lengthened += 1
    assert lengthened >= 2  # rows whose unconstrained-by-min_tokens output ended early


@pytest.mark.parametrize("seed", [None, 5])
def test_a_complete_grammar_ends_the_row_before_min_tokens(loaded, prompts, seed):
    """When the grammar allows nothing but the end (a choice is complete), the grammar wins:
    the row ends there with finish_reason stop, exactly as without min_tokens."""
    constraint = Constraint.choice(CHOICES)
    rows = [
        GenerationRequest(i, prompt, params(constraint, seed=seed, n=2, min_tokens=30))
        for i, prompt in enumerate(prompts)
    ]
    plain = [
        GenerationRequest(i, prompt, params(constraint, seed=seed, n=2))
        for i, prompt in enumerate(prompts)
    ]
    held, _ = generate_sync(loaded, rows, CONFIG)
    free, _ = generate_sync(loaded, plain, CONFIG)
    assert [r.token_ids for r in held] == [r.token_ids for r in free]
    for result in held:
        assert (result.finish_reason, result.error) == ("stop", None)
        assert result.text in CHOICES
        assert result.token_ids[-1] in loaded.eos_token_ids
        assert result.completion_tokens < 30


def test_matchers_follow_their_sequences_step_by_step(loaded, prompts):
    core = EngineCore(loaded, Config(page_size=8, num_pages=40, max_num_seqs=8))
    for i, prompt in enumerate(prompts):
        core.add_request(GenerationRequest(i, prompt, params(KINDS[i % len(KINDS)], n=2)))
    done = []
    try:
        while core.num_unfinished:
            done += core.step()
            core.check_invariants()
    finally:
        core.close()
    assert len(done) == 2 * len(prompts)
    assert core.stats().preemptions > 0


def test_unpacked_masks_equal_xgrammars_cpu_kernel(loaded):
    """The device path (unpacking the bitmask with torch) masks exactly what xgrammar's own
    CPU kernel masks."""
    import torch

    from astrai_batch.engine.sampling.constraints.xgrammar_backend import (
        XGrammarBackend,
        unpack_masks,
    )

    vocab = loaded.model.config.vocab_size
    backend = XGrammarBackend(loaded.tokenizer, vocab_size=vocab, eos_token_ids=[2])
    matchers = [backend.matcher(backend.compile(constraint)) for constraint in KINDS]
    masks = backend.allocate_masks(len(KINDS) + 1)
    rows = [0, 2, 3, 4, 5]
    backend.fill_masks(matchers, masks, rows)
    scores = torch.randn(len(KINDS) + 1, vocab)
    by_kernel = scores.clone()
    backend.apply_masks(by_kernel, masks, rows)
    allowed = unpack_masks(masks, vocab)
    by_unpacking = scores.masked_fill(~allowed, float("-inf"))
    by_unpacking[1] = scores[1]  # row 1 is unconstrained
    assert torch.equal(by_kernel, by_unpacking)
    assert torch.isinf(by_kernel[rows]).any(dim=1).all()
