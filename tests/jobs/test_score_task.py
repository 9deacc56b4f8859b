"""`run --task score`: one output row per input row with lm-eval's loglikelihood answers
(within 1e-4 of a transformers forward per pair, is_greedy exact), lm-eval's `_encode_pair`
tokenization, and bad rows as error rows with exact text."""

from __future__ import annotations

import pytest
import torch
from jobs.jobkit import read_rows, run_cli, summary_of, write_jsonl, write_parquet
from transformers import AutoModelForCausalLM, AutoTokenizer

SHOTS = "Q: two plus two? A: four.\nQ: one plus one? A: two.\n"


def lm_eval_pair(tokenizer, context: str, continuation: str):
    """lm-evaluation-harness's HFLM._encode_pair, verbatim in substance."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    context_enc = tokenizer(context, add_special_tokens=False)["input_ids"]
    return context_enc, whole[len(context_enc) :]


def hf_loglikelihood(model, context_enc, continuation_enc):
    tokens = context_enc + continuation_enc
    with torch.inference_mode():
        logits = model(torch.tensor([tokens[:-1]])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(context_enc) - 1 :]
    target = torch.tensor(continuation_enc)
    picked = logprobs[torch.arange(len(target)), target]
    return float(picked.sum()), bool((logprobs.argmax(-1) == target).all())


def lm_eval_request(tokenizer, context: str, continuation: str):
    """lm-evaluation-harness's TemplateLM.loglikelihood: an empty context is
    `[prefix_token_id]` (BOS, else EOS) and the continuation is encoded alone."""
    if context == "":
        prefix = tokenizer.bos_token_id
        if prefix is None:
            prefix = tokenizer.eos_token_id
        return [prefix], tokenizer(continuation, add_special_tokens=False)["input_ids"]
    return lm_eval_pair(tokenizer, context, continuation)


def test_an_empty_context_scores_after_the_prefix_token(tmp_path, tiny_llama_dir):
    """lm-eval's convention for an empty context (unconditional loglikelihood, e.g.
    acc_mutual_info's denominators): the continuation's first token is scored after the BOS
    (else EOS) token; a transformers forward over those tokens is the reference."""
    rows = [
        {"id": "u", "context": "", "continuations": [" four", "Paris is the capital"]},
        {"id": "c", "context": "Q: A:", "continuations": [" four"]},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--task", "score", "--quiet")
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert tokenizer.bos_token_id is not None
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    for row, record in zip(rows, read_rows(output), strict=True):
        assert record["error"] is None
        expected = [lm_eval_request(tokenizer, row["context"], c) for c in row["continuations"]]
        assert record["prompt_tokens"] == len(expected[0][0])
        assert record["continuation_tokens"] == [len(c) for _, c in expected]
        for (ctx, cont), got, greedy in zip(
            expected, record["loglikelihoods"], record["is_greedy"], strict=True
        ):
            want, want_greedy = hf_loglikelihood(model, ctx, cont)
            assert abs(got - want) < 1e-4
            assert greedy == want_greedy


def test_score_rows_match_transformers(tmp_path, tiny_llama_dir):
    rows = [
        {"id": "a", "context": SHOTS + "Q: three plus one? A: ", "continuations": ["four", "x"]},
        {"id": "b", "context": SHOTS + "Q: two plus one? A:", "continuations": [" three", " 3."]},
        {"id": "c", "context": SHOTS + "Q: zero plus zero? A:", "continuations": [" zero"]},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--task", "score", "--quiet")
    assert result.exit_code == 0, result.output
    summary = summary_of(result.stdout)
    out = read_rows(output)
    assert [r["id"] for r in out] == ["a", "b", "c"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    for row, record in zip(rows, out, strict=True):
        assert record["error"] is None
        expected = [lm_eval_pair(tokenizer, row["context"], c) for c in row["continuations"]]
        assert record["continuation_tokens"] == [len(c) for _, c in expected]
        assert record["prompt_tokens"] == len(expected[0][0])
        for (ctx, cont), got, greedy in zip(
            expected, record["loglikelihoods"], record["is_greedy"], strict=True
        ):
            want, want_greedy = hf_loglikelihood(model, ctx, cont)
            assert abs(got - want) < 1e-4
            assert greedy == want_greedy
    assert summary["status"] == "completed"


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"context": "Q: A:", "continuations": []}, "continuations is empty"),
        ({"context": "Q: A:"}, "continuations is missing"),
        ({"context": "Q: A:", "continuations": ["a", ""]}, "continuations[1] is empty"),
        (
            {"context": "Q: A:", "continuations": "a"},
            "continuations must be a list of strings, got string",
        ),
        (
            {"context": "Q: A:", "continuations": ["a", 3]},
            "continuations[1] must be a string, got integer",
        ),
        (
            {"context": "Q:", "continuations": ["a"], "max_tokens": 3},
            "max_tokens is not a field of --task score",
        ),
        ({"context": "  ", "continuations": ["a"]}, "context is only whitespace"),
        ({"continuations": ["a"]}, "context is missing"),
        ({"context": "word " * 1100, "continuations": [" a"]}, None),
    ],
)
def test_bad_score_rows_are_error_rows(tmp_path, tiny_llama_dir, row, error):
    good = {"id": "good", "context": "Q: A:", "continuations": [" yes", " no"]}
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "bad", **row}, good])
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--task", "score", "--quiet")
    assert result.exit_code == 0, result.output
    bad, fine = read_rows(output)
    if error is None:  # over the model's length: the engine's message
        assert (
            bad["error"].startswith("context (") and "exceeds the model context of" in bad["error"]
        )
    else:
        assert bad["error"] == error
    assert bad["finish_reason"] == "error" and bad["loglikelihoods"] is None
    assert fine["error"] is None and len(fine["loglikelihoods"]) == 2


def test_generate_rows_with_continuations_are_refused(tmp_path, tiny_llama_dir):
    lines = [{"id": "x", "prompt": "Q:", "continuations": ["a"]}, {"id": "y", "prompt": "Q:"}]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--max-tokens", "2", "-q")
    assert result.exit_code == 0, result.output
    refused, generated = read_rows(output)
    assert refused["error"] == "continuations is a field of --task score"
    assert generated["error"] is None and "loglikelihoods" not in generated


def test_parquet_chat_contexts_score_the_rendered_template(tmp_path, tiny_llama_dir):
    messages = [{"role": "user", "content": "Say yes."}]
    source = write_parquet(
        tmp_path / "in.parquet",
        {"id": ["m"], "context": [messages], "continuations": [["yes", " no"]]},
    )
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--task", "score", "--quiet")
    assert result.exit_code == 0, result.output
    (record,) = read_rows(output)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    for continuation, got in zip(["yes", " no"], record["loglikelihoods"], strict=True):
        ctx, cont = lm_eval_pair(tokenizer, rendered, continuation)
        assert abs(got - hf_loglikelihood(model, ctx, cont)[0]) < 1e-4
