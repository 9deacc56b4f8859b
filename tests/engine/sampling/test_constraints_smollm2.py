"""Constrained decoding on the real SmolLM2-135M (slow: real weights).

The reference is not our code: transformers `generate` with xgrammar's own transformers
logits processor, over the same grammar and a tokenizer info built the documented way
(model vocabulary size, the model's end-of-sequence ids as stop tokens).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from engine_reference import hf_greedy

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.sampling.constraints import Constraint

pytestmark = pytest.mark.slow

SYSTEM = "Extract the person as JSON with the fields name (string) and age (integer)."
PEOPLE = [
    "Maria is 34 years old and lives in Lisbon.",
    "The report was written by John Smith, aged 52.",
    "Our youngest member, Aiko, just turned 19.",
    "Pierre Dupont (71) retired last year.",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
CHOICES = ["positive", "negative", "neutral"]
REGEX = r"[A-Z][a-z]+ is [0-9]{1,3}\."
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    return load_model("smollm2-135m")


def chat(loaded, system: str, user: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return loaded.tokenizer(text, add_special_tokens=False)["input_ids"]


def reference(loaded, prompts, constraint: Constraint, min_tokens: int = 0) -> list[list[int]]:
    import xgrammar
    from xgrammar.contrib.hf import LogitsProcessor

    info = xgrammar.TokenizerInfo.from_huggingface(
        loaded.tokenizer,
        vocab_size=loaded.model.config.vocab_size,
        stop_token_ids=sorted(loaded.eos_token_ids),
    )
    compiler = xgrammar.GrammarCompiler(info)
    if constraint.kind == "json_schema":
        compiled = compiler.compile_json_schema(constraint.text)
    else:
        compiled = compiler.compile_regex(constraint.text)
    return hf_greedy(
        loaded.source,
        prompts,
        MAX_TOKENS,
        logits_processors=lambda _: [LogitsProcessor(compiled)],
        min_new_tokens=min_tokens,
    )


@pytest.mark.parametrize(
    "constraint", [Constraint.json_schema(SCHEMA), Constraint("regex", REGEX)], ids=str
)
def test_greedy_constrained_matches_transformers_with_xgrammar_processor(loaded, constraint):
    prompts = [chat(loaded, SYSTEM, person) for person in PEOPLE]
    params = SamplingParams(max_tokens=MAX_TOKENS, constraint=constraint)
    config = EngineConfig(page_size=16, num_pages=64, max_num_batched_tokens=64)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    results, stats = generate_sync(loaded, requests, config)
    assert [list(r.token_ids) for r in results] == reference(loaded, prompts, constraint)
    assert stats.grammars_compiled == 1
    assert stats.constrained_requests == len(PEOPLE)


def test_every_completion_obeys_its_constraint(loaded):
    prompts = [chat(loaded, SYSTEM, person) for person in PEOPLE]
    kinds = [
        Constraint.json_schema(SCHEMA),
        Constraint.choice(CHOICES),
        Constraint("regex", REGEX),
    ]
    requests = []
    for i, prompt in enumerate(prompts):
        for k, constraint in enumerate(kinds):
            for seed in (None, 3):
                temperature = 0.0 if seed is None else 0.9
                params = SamplingParams(
                    max_tokens=64, temperature=temperature, seed=seed, constraint=constraint
                )
                requests.append(GenerationRequest((i, k, seed), prompt, params))
    results, _ = generate_sync(loaded, requests, EngineConfig(page_size=16, num_pages=256))
    finished = 0
    for result in results:
        _, k, _ = result.request_id
        assert result.finish_reason in ("stop", "length")
        if result.finish_reason == "length":
            continue
        finished += 1
        if k == 0:
            jsonschema.validate(json.loads(result.text), SCHEMA)
        elif k == 1:
            assert result.text in CHOICES
        else:
            assert re.fullmatch(REGEX, result.text)
    assert finished >= len(requests) // 2


def test_min_tokens_under_a_constraint_matches_transformers(loaded):
    """EOS masked while the grammar could go on, as generate(min_new_tokens=...) masks it
    beside xgrammar's processor; greedy, token for token."""
    # a sentence may go on after its full stop: the model ends some rows there, early
    constraint = Constraint("regex", "[A-Za-z .]+")
    system = "Answer with one word: the person's first name."
    prompts = [chat(loaded, system, person) for person in PEOPLE]
    config = EngineConfig(page_size=16, num_pages=64, max_num_batched_tokens=64)
    free = SamplingParams(max_tokens=MAX_TOKENS, constraint=constraint)
    held = free.replace(min_tokens=8)
    requests = [GenerationRequest(i, p, free) for i, p in enumerate(prompts)]
    short, _ = generate_sync(loaded, requests, config)
    requests = [GenerationRequest(i, p, held) for i, p in enumerate(prompts)]
    results, _ = generate_sync(loaded, requests, config)
    assert [list(r.token_ids) for r in results] == reference(loaded, prompts, constraint, 8)
    assert all(r.completion_tokens > 8 for r in results)
    assert any(r.completion_tokens <= 8 for r in short)  # min_tokens changed those rows
