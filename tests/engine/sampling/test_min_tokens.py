"""min_tokens holds off stop strings, stop token ids and EOS (vLLM semantics), in the engine and
through `astrai-batch run`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from engine.stop_reference import prefix_texts, vllm_stop
from engine_reference import _reference_model, mixed_prompts

from astrai_batch.cli import main
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model

CONFIG = EngineConfig(page_size=8, num_pages=128, max_num_seqs=8)
MAX_NEW = 20


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def prompt(loaded):
    # With seed 7 this prompt's greedy text starts "S on on on": spaces from token 2 on, and
    # "n o" across the token boundaries, which is what the stop-string cases below need.
    return mixed_prompts(loaded.model.config.vocab_size, seed=7, count=8)[4]


@pytest.fixture(scope="module")
def free_run(loaded, prompt):
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompt, params)], CONFIG)
    return results[0].token_ids


def run(loaded, prompt, **params):
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, **params)
    results, _ = generate_sync(loaded, [GenerationRequest(0, prompt, params)], CONFIG)
    return results[0]


@pytest.mark.parametrize(
    ("stop", "min_tokens"),
    [(" ", 0), (" ", 1), (" ", 2), (" ", 6), ("n o", 0), ("n o", 2), ("n o", 3)],
)
def test_stop_strings_wait_for_min_tokens(loaded, prompt, free_run, stop, min_tokens):
    texts = prefix_texts(loaded.tokenizer, free_run)
    assert texts[4].startswith("S on on"), texts[4]  # the scenario the cases are chosen for
    want = vllm_stop(texts, stop, min_tokens)
    assert want is not None
    result = run(loaded, prompt, stop=(stop,), min_tokens=min_tokens)
    assert (result.completion_tokens, result.text) == want
    assert result.finish_reason == "stop"
    assert result.completion_tokens > min_tokens
    assert result.token_ids == free_run[: result.completion_tokens]


def test_a_stop_string_begun_before_min_tokens_and_completed_after_it_stops(
    loaded, prompt, free_run
):
    # "n o" starts in token 2's text ("S on") and ends in token 3's (" on"): vLLM looks at
    # token 3's new text together with the two characters before it, so it stops there and
    # the text is cut inside the held-off part.
    texts = prefix_texts(loaded.tokenizer, free_run)
    result = run(loaded, prompt, stop=("n o",), min_tokens=2)
    assert result.completion_tokens == 3
    assert result.text == texts[3][: texts[3].index("n o")]
    assert len(result.text) < len(texts[2])


def test_stop_token_ids_and_eos_wait_for_min_tokens_like_transformers(loaded, prompt, free_run):
    # The first generated token is made a stop id: without min_tokens the row ends at once;
    # with it the id is masked and the row ends where generate(min_new_tokens=...) ends.
    stop_id = free_run[0]
    eos = sorted(loaded.eos_token_ids)
    assert run(loaded, prompt, stop_token_ids=(stop_id,)).token_ids == (stop_id,)
    model = _reference_model(str(loaded.source))
    for min_tokens in (1, 4):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_NEW,
                min_new_tokens=min_tokens,
                eos_token_id=[stop_id, *eos],
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
        want = tuple(out[0, len(prompt) :].tolist())
        params = SamplingParams(
            max_tokens=MAX_NEW, min_tokens=min_tokens, stop_token_ids=(stop_id,)
        )
        results, _ = generate_sync(loaded, [GenerationRequest(0, prompt, params)], CONFIG)
        assert results[0].token_ids == want
        assert len(want) > min_tokens
        if want[-1] in (stop_id, *eos):
            assert results[0].finish_reason == "stop"


def test_run_with_min_tokens_and_a_space_stop_waits(loaded, prompt, free_run, tmp_path: Path):
    """The issue's example: `--min-tokens N --stop " "` used to end rows after one token."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt_token_ids": prompt}) + "\n")
    output = tmp_path / "out.parquet"
    args = ["run", str(source), str(output), "--model", str(loaded.source), "--quiet"]
    args += ["--max-tokens", str(MAX_NEW), "--min-tokens", "6", "--stop", " "]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    texts = prefix_texts(loaded.tokenizer, free_run)
    tokens, text = vllm_stop(texts, " ", 6)
    assert texts[2].endswith(" on")  # a space came long before min_tokens
    assert tokens > 6
    row = pq.read_table(output).to_pylist()[0]
    assert (row["finish_reason"], row["completion_tokens"], row["completion"]) == (
        "stop",
        tokens,
        text,
    )
