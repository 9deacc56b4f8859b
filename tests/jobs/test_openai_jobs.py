"""OpenAI batch lines through whole jobs on a tiny model: the field table's warnings,
body.model, the Completions API's logprobs; every success body is validated with the
`openai` package's own response types."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, question, run_cli, write_jsonl
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSE_TYPES = {
    "chat.completion": ChatCompletion,
    "text_completion": Completion,
    "list": CreateEmbeddingResponse,
}


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(custom_id: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": question(len(custom_id))}]
    return line(custom_id, CHAT, messages=messages, **body)


def run_lines(
    model_dir: Path, tmp_path: Path, lines: list[dict[str, Any]], *extra: str
) -> tuple[list[dict[str, Any]], str]:
    """The output lines (each success body validated by its openai type) and stderr."""
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    args = [*engine_args(model_dir, *extra), "--output-format", "openai-jsonl", "--overwrite"]
    if "--task" in extra:  # the other tasks take no --max-tokens
        at = args.index("--max-tokens")
        del args[at : at + 2]
    result = run_cli("run", source, output, *args)
    assert result.exit_code == 0, result.stderr
    out = [json.loads(text) for text in output.read_text().splitlines()]
    for item in out:
        if item["response"] is not None:
            body = item["response"]["body"]
            if not validated_by_its_test(body):
                RESPONSE_TYPES[body["object"]].model_validate(body, strict=False)
    return out, result.stderr


def validated_by_its_test(body: dict[str, Any]) -> bool:
    """Bodies whose test validates them around what the openai types do not admit: an echoed
    prompt's first null logprob, a base64 embedding (text the client decodes)."""
    if body["object"] == "list":
        return isinstance(body["data"][0]["embedding"], str)
    logprobs = body["choices"][0].get("logprobs")
    return bool(
        logprobs and logprobs.get("token_logprobs") and logprobs["token_logprobs"][0] is None
    )


def test_ignored_fields_warn_once_per_name_per_job(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = [
        chat("a", store=True, metadata={"k": "v"}),
        chat("bb", store=False, verbosity="low"),
        chat("ccc", metadata={"k": "w"}, stream=True),
    ]
    args = [a for a in engine_args(tiny_llama_dir) if a != "--quiet"]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    result = run_cli(
        "run", source, tmp_path / "out.jsonl", *args, "--output-format", "openai-jsonl"
    )
    assert result.exit_code == 0, result.stderr
    warnings = [text for text in result.stderr.splitlines() if "warning:" in text]
    assert warnings == [
        "astrai-batch: warning: body field 'metadata' is ignored: tags for OpenAI's stored "
        "completions",
        "astrai-batch: warning: body field 'store' is ignored: storing completions is "
        "OpenAI's service",
        "astrai-batch: warning: body field 'verbosity' is ignored: steers OpenAI's own models only",
    ]
    out = [json.loads(text) for text in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [item["error"] is None for item in out] == [True, True, False]
    assert out[2]["error"]["message"].startswith("body.stream cannot be honoured: ")


def test_body_model_names_the_base_model_an_alias_or_an_adapter(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    lines = [
        chat("as-given", model=str(tiny_llama_dir)),
        chat("none"),
        chat("other", model="gpt-4o-mini"),
    ]
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines)
    assert [item["error"] for item in out[:2]] == [None, None]
    assert out[0]["response"]["body"]["model"] == str(tiny_llama_dir)
    assert out[2]["error"] == {
        "code": "invalid_request",
        "message": f"body.model 'gpt-4o-mini' is not served by this job; it serves "
        f"{str(tiny_llama_dir)!r}",
    }

    aliased, _ = run_lines(
        tiny_llama_dir,
        tmp_path,
        [chat("alias", model="gpt-4o-mini"), chat("path", model=str(tiny_llama_dir))],
        "--served-model-name",
        "gpt-4o-mini",
        "--served-model-name",
        "tiny",
    )
    assert aliased[0]["response"]["body"]["model"] == "gpt-4o-mini"
    # served names replace the path, as vLLM's --served-model-name does
    assert aliased[1]["error"]["message"] == (
        f"body.model {str(tiny_llama_dir)!r} is not served by this job; it serves "
        "'gpt-4o-mini', 'tiny'"
    )


@pytest.mark.parametrize("count", [0, 3])
def test_completions_integer_logprobs(tiny_llama_dir: Path, tmp_path: Path, count: int) -> None:
    lines = [
        line("t", COMPLETIONS, prompt=question(1), logprobs=count, max_tokens=3),
        line("ids", COMPLETIONS, prompt=[[1, 45, 46]], max_tokens=2),
    ]
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines, "--ignore-eos")
    body = Completion.model_validate(out[0]["response"]["body"])
    logprobs = body.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == 3
    assert len(logprobs.token_logprobs or []) == 3
    assert logprobs.text_offset == [
        0,
        len(logprobs.tokens[0]),
        len(logprobs.tokens[0]) + len(logprobs.tokens[1]),
    ]
    if count == 0:
        assert logprobs.top_logprobs is None
    else:
        assert [len(top) for top in logprobs.top_logprobs or []] == [3, 3, 3]
        tops, chosen_values = logprobs.top_logprobs or [], logprobs.token_logprobs or []
        for top, chosen in zip(tops, chosen_values, strict=True):
            assert max(top.values()) >= chosen  # the likeliest alternative is at least it
    assert out[1]["error"] is None
    assert out[1]["response"]["body"]["usage"]["prompt_tokens"] == 3


UNIT_PARAMS = {
    "type": "object",
    "properties": {"unit": {"enum": ["C", "F"]}, "daily": {"type": "boolean"}},
    "required": ["unit", "daily"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": UNIT_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": UNIT_PARAMS}}


def test_forced_tool_calls_come_back_as_tool_calls(tiny_llama_dir: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    named = {"type": "function", "function": {"name": "get_weather"}}
    lines = [
        chat("named", tools=[WEATHER, TIME], tool_choice=named, max_tokens=400, n=2),
        chat("required", tools=[WEATHER, TIME], tool_choice="required", max_tokens=400),
        chat(
            "legacy",
            functions=[TIME["function"]],
            function_call={"name": "get_time"},
            max_tokens=400,
        ),
        chat("auto", tools=[WEATHER]),
    ]
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines, "--temperature", "1.0")
    for item in out[:3]:
        body = ChatCompletion.model_validate(item["response"]["body"])
        for choice in body.choices:
            assert choice.finish_reason == "tool_calls", item["custom_id"]
            assert choice.message.content is None
            calls = choice.message.tool_calls or []
            assert calls and all(call.id.startswith("call_") for call in calls)
            for call in calls:
                assert call.function.name in ("get_weather", "get_time")
                jsonschema.validate(json.loads(call.function.arguments), UNIT_PARAMS)
    named_calls = [c["message"]["tool_calls"] for c in out[0]["response"]["body"]["choices"]]
    assert [[call["function"]["name"] for call in calls] for calls in named_calls] == [
        ["get_weather"],
        ["get_weather"],
    ]
    assert named_calls[0][0]["id"] != named_calls[1][0]["id"]
    assert (
        out[2]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
        == "get_time"
    )
    assert out[3]["error"]["message"] == (
        "tool_choice auto (the default with tools) needs --tool-call-parser to read calls from "
        "the model's text; give one, or a tool_choice of required or a named function"
    )

    # the same lines into Parquet: the content column, and the calls in their own column
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "tools.parquet"
    args = [*engine_args(tiny_llama_dir), "--temperature", "1.0", "--tool-call-parser", "hermes"]
    result = run_cli("run", source, output, *args)
    assert result.exit_code == 0, result.stderr
    rows = pq.read_table(output).to_pylist()
    calls = [
        [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in row["tool_calls"]
        ]
        if row["tool_calls"] is not None
        else None
        for row in rows
    ]
    assert calls[:2] == named_calls  # the same ids and arguments as the JSONL output
    assert [row["completion"] for row in rows[:2]] == [None, None]
    # auto with a parser runs; a random model's text holds no calls, so it stays content
    assert rows[-1]["error"] is None and rows[-1]["tool_calls"] is None
    assert isinstance(rows[-1]["completion"], str)


def test_reasoning_parser_splits_reasoning_content(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = [chat("a"), chat("bb", max_tokens=6)]
    plain, _ = run_lines(tiny_llama_dir, tmp_path, lines)
    split, _ = run_lines(tiny_llama_dir, tmp_path, lines, "--reasoning-parser", "deepseek_r1")
    for before, after in zip(plain, split, strict=True):
        old = before["response"]["body"]["choices"][0]
        new = after["response"]["body"]["choices"][0]
        # a random model never closes </think>: cut off inside its reasoning, no content
        assert "</think>" not in old["message"]["content"]
        assert new["message"]["reasoning_content"] == old["message"]["content"]
        assert new["message"]["content"] is None
        assert new["finish_reason"] == old["finish_reason"] == "length"
        assert after["response"]["body"]["usage"] == before["response"]["body"]["usage"]
    kept, _ = run_lines(tiny_llama_dir, tmp_path, lines, "--reasoning-parser", "qwen3")
    # qwen3 without a think block: all answer
    assert [k["response"]["body"]["choices"] for k in kept] == [
        p["response"]["body"]["choices"] for p in plain
    ]

    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "reasoning.parquet"
    result = run_cli(
        "run", source, output, *engine_args(tiny_llama_dir), "--reasoning-parser", "deepseek_r1"
    )
    assert result.exit_code == 0, result.stderr
    rows = pq.read_table(output).to_pylist()
    assert [row["reasoning"] for row in rows] == [
        p["response"]["body"]["choices"][0]["message"]["content"] for p in plain
    ]
    assert [row["completion"] for row in rows] == [None, None]


def lm_eval_encode_pair(tokenizer, context: str, continuation: str) -> tuple[list, list]:
    """lm-evaluation-harness's `_encode_pair` (trailing context spaces move to the
    continuation; the whole is encoded, the continuation is what follows the context)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    return context_ids, whole[len(context_ids) :]


def test_lm_eval_completions_requests_give_the_score_tasks_loglikelihoods(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    pairs = [
        ("Question 3: what is 2 plus", [" 4", " five", " 4 or 5"]),
        ("def fibonacci(n): return ", ["n", "fibonacci(n - 1)"]),
    ]
    score_rows = [
        {"id": f"s{k}", "context": context, "continuations": continuations}
        for k, (context, continuations) in enumerate(pairs)
    ]
    source = write_jsonl(tmp_path / "score.jsonl", score_rows)
    scored_path = tmp_path / "scores.parquet"
    score_args = [a for a in engine_args(tiny_llama_dir) if a not in ("--max-tokens", "4")]
    result = run_cli("run", source, scored_path, *score_args, "--task", "score")
    assert result.exit_code == 0, result.stderr
    scored = pq.read_table(scored_path).to_pylist()

    # lm-eval's local-completions request: token ids, echo, logprobs 1, greedy; max_tokens 0
    # (the prompt alone) and 1 (lm-eval's own payload, the generated token dropped by [:-1])
    lines, expected, lengths = [], [], []
    for row, (context, continuations) in zip(scored, pairs, strict=True):
        for number, continuation in enumerate(continuations):
            context_ids, continuation_ids = lm_eval_encode_pair(tokenizer, context, continuation)
            assert len(continuation_ids) == row["continuation_tokens"][number]
            for max_tokens in (0, 1):
                body = {
                    "model": str(tiny_llama_dir),
                    "prompt": [context_ids + continuation_ids],
                    "temperature": 0,
                    "max_tokens": max_tokens,
                    "logprobs": 1,
                    "seed": 1234,
                    "echo": True,
                }
                lines.append(line(f"c{len(lines)}", COMPLETIONS, **body))
                expected.append((row["loglikelihoods"][number], row["is_greedy"][number]))
                lengths.append((len(context_ids), max_tokens))
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines)
    for item, (loglikelihood, greedy), (context_length, max_tokens) in zip(
        out, expected, lengths, strict=True
    ):
        choice = item["response"]["body"]["choices"][0]
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        end = len(logprobs["tokens"]) - max_tokens
        # lm-eval's parse_logprobs
        values = logprobs["token_logprobs"][context_length:end]
        tops = logprobs["top_logprobs"][context_length:end]
        assert sum(values) == loglikelihood  # bit for bit: the same logits, summed in order
        assert (
            all(value == max(top.values()) for value, top in zip(values, tops, strict=True))
            == greedy
        )
        assert item["response"]["body"]["usage"]["completion_tokens"] == max_tokens
        # the openai type, but for the first echoed token's null (OpenAI and vLLM write
        # null there; the package's type says float and its client does not validate)
        body = json.loads(json.dumps(item["response"]["body"]))
        body["choices"][0]["logprobs"]["token_logprobs"][0] = 0.0
        body["choices"][0]["logprobs"]["top_logprobs"][0] = {}
        Completion.model_validate(body)


def test_logit_bias_steers_generation_and_never_breaks_a_constraint(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    z = tokenizer.convert_tokens_to_ids("z")
    plain = line("plain", COMPLETIONS, prompt=question(4), max_tokens=4, logprobs=0)
    out, _ = run_lines(tiny_llama_dir, tmp_path, [plain], "--ignore-eos")
    first = tokenizer(out[0]["response"]["body"]["choices"][0]["logprobs"]["tokens"][0])
    schema = {"type": "object", "properties": {"a": {"enum": ["yes", "no"]}}, "required": ["a"]}
    lines = [
        line("forced", COMPLETIONS, prompt=question(4), max_tokens=4, logit_bias={str(z): 100}),
        line(
            "banned",
            COMPLETIONS,
            prompt=question(4),
            max_tokens=1,
            logit_bias={str(first["input_ids"][-1]): -100},
        ),
        chat(
            "constrained",
            max_tokens=60,
            logit_bias={str(z): 100},
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        ),
        line("outside", COMPLETIONS, prompt=question(4), logit_bias={"100000": 1}),
    ]
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines, "--ignore-eos")
    assert out[0]["response"]["body"]["choices"][0]["text"] == "zzzz"
    assert not out[1]["response"]["body"]["choices"][0]["text"].startswith(
        tokenizer.decode(first["input_ids"][-1:])
    )
    answer = json.loads(out[2]["response"]["body"]["choices"][0]["message"]["content"])
    assert answer["a"] in ("yes", "no")  # the grammar's -inf wins over +100
    assert out[3]["error"]["message"] == (
        f"logit_bias token id 100000 is outside the vocabulary (size {len(tokenizer)})"
    )


def test_embeddings_lines_embed_in_a_generate_job(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import base64
    import struct

    texts = ["The capital of France is Paris.", "def add(a, b): return a + b"]
    embed_lines = [line(f"e{k}", "/v1/embeddings", input=text) for k, text in enumerate(texts)]
    # the reference: the same lines in a --task embed job
    reference, _ = run_lines(tiny_llama_dir, tmp_path, embed_lines, "--task", "embed")
    vectors = [item["response"]["body"]["data"][0]["embedding"] for item in reference]

    lines = [
        chat("chat"),
        *embed_lines,
        line("b64", "/v1/embeddings", input=texts[0], encoding_format="base64"),
        line("d8", "/v1/embeddings", input=texts[1], dimensions=8),
        line("bad", "/v1/embeddings", input=texts[1], encoding_format="int8"),
        line("list", "/v1/embeddings", input=texts[::-1]),
        line("ids", "/v1/embeddings", input=[[1, 45, 46], [1, 47]]),
        line("id0", "/v1/embeddings", input=[1, 45, 46]),
        line("id1", "/v1/embeddings", input=[1, 47]),
    ]
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines)
    # several inputs: data[i] is input i's embedding, as its own line gives it; usage sums
    listed = out[6]["response"]["body"]
    assert [item["index"] for item in listed["data"]] == [0, 1]
    assert [item["embedding"] for item in listed["data"]] == vectors[::-1]
    assert listed["usage"]["prompt_tokens"] == sum(
        item["response"]["body"]["usage"]["prompt_tokens"] for item in reference
    )
    by_ids = out[7]["response"]["body"]
    alone = [out[k]["response"]["body"]["data"][0]["embedding"] for k in (8, 9)]
    assert [item["embedding"] for item in by_ids["data"]] == alone
    assert by_ids["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert out[0]["response"]["body"]["object"] == "chat.completion"
    assert [item["response"]["body"]["data"][0]["embedding"] for item in out[1:3]] == vectors
    encoded = out[3]["response"]["body"]["data"][0]["embedding"]
    raw = base64.b64decode(encoded)
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert decoded == [struct.unpack("<f", struct.pack("<f", v))[0] for v in vectors[0]]
    body = json.loads(json.dumps(out[3]["response"]["body"]))
    body["data"][0]["embedding"] = decoded  # what the openai client decodes base64 into
    CreateEmbeddingResponse.model_validate(body)
    # the tiny model is no Matryoshka model (test_embed_task checks one that is)
    assert out[4]["error"]["message"].startswith(
        "body.dimensions 8 cannot be honoured: the model is not a Matryoshka embedding model"
    )
    assert out[5]["error"]["message"] == "body.encoding_format must be float or base64, got 'int8'"

    # Parquet: the vectors in an embedding column beside the completions
    source = write_jsonl(tmp_path / "mixed.jsonl", lines)
    result = run_cli("run", source, tmp_path / "mixed.parquet", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    rows = pq.read_table(tmp_path / "mixed.parquet").to_pylist()
    assert rows[0]["embedding"] is None and isinstance(rows[0]["completion"], str)
    assert [row["embedding"] for row in rows[1:3]] == vectors
    # a line of several inputs has a row per input, sample_index its place in body.input
    listed_rows = [row for row in rows if row["id"] == "list"]
    assert [(r["sample_index"], r["embedding"]) for r in listed_rows] == list(
        enumerate(vectors[::-1])
    )

    # a --task embed job answers a line of several inputs too
    embed_out, _ = run_lines(tiny_llama_dir, tmp_path, [lines[6]], "--task", "embed")
    assert embed_out[0]["response"]["body"]["data"] == listed["data"]


def test_best_of_returns_the_likeliest_of_its_samples(tiny_llama_dir: Path, tmp_path: Path) -> None:
    body = {"prompt": question(5), "max_tokens": 4, "temperature": 1.0, "seed": 7}
    every, _ = run_lines(
        tiny_llama_dir, tmp_path, [line("r", COMPLETIONS, n=4, logprobs=0, **body)]
    )
    samples = every[0]["response"]["body"]["choices"]
    ranked = sorted(
        samples, key=lambda c: (-math.fsum(c["logprobs"]["token_logprobs"]), c["index"])
    )
    best, _ = run_lines(tiny_llama_dir, tmp_path, [line("r", COMPLETIONS, n=2, best_of=4, **body)])
    choices = best[0]["response"]["body"]["choices"]
    assert [c["text"] for c in choices] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in choices] == [0, 1]
    assert [c["logprobs"] for c in choices] == [None, None]  # the line did not ask for them


def test_several_prompts_answer_each_as_its_own_line_would(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """A line of several prompts: choice p * n + s is prompt p's sample s, exactly the
    choice s of a line holding prompt p alone (same seed), with echo, logprobs and best_of
    per prompt; usage sums every prompt's tokens."""
    texts = [question(1), question(2), question(3)]
    sampled = {"n": 2, "temperature": 1.0, "seed": 7, "logprobs": 1, "max_tokens": 3}
    echo = {"echo": True, "logprobs": 1, "max_tokens": 0}
    best = {"n": 1, "best_of": 3, "temperature": 1.0, "seed": 3, "max_tokens": 3}
    ids = [[1, 45, 46], [1, 47], [1, 48, 49, 50]]
    groups = {
        "sampled": (texts, sampled),
        "ids": (ids, {"max_tokens": 2}),
        "echo": (texts[:2], echo),
        "best": (texts[1:], best),
    }
    lines = []
    for name, (prompts, body) in groups.items():
        lines.append(line(name, COMPLETIONS, prompt=prompts, **body))
        lines += [
            line(f"{name}{p}", COMPLETIONS, prompt=[x], **body) for p, x in enumerate(prompts)
        ]
    lines.append(line("mixed", COMPLETIONS, prompt=["a", [1, 2]]))
    out, _ = run_lines(tiny_llama_dir, tmp_path, lines)
    by_id = {item["custom_id"]: item for item in out}
    for name, (prompts, _) in groups.items():
        body = by_id[name]["response"]["body"]
        singles = [by_id[f"{name}{p}"]["response"]["body"] for p in range(len(prompts))]
        expected = [
            {**choice, "index": position}
            for position, choice in enumerate(c for single in singles for c in single["choices"])
        ]
        assert body["choices"] == expected, name
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert body["usage"][key] == sum(single["usage"][key] for single in singles)
    assert len(by_id["sampled"]["response"]["body"]["choices"]) == 6
    assert len(by_id["best"]["response"]["body"]["choices"]) == 2
    echoed = by_id["echo"]["response"]["body"]["choices"]
    assert [c["text"][: len(t)] for c, t in zip(echoed, texts, strict=False)] == texts[:2]
    assert by_id["mixed"]["error"]["message"] == (
        "body.prompt must be a string, a list of token ids, a list of strings or a list of "
        "token-id lists, got a list mixing them"
    )
