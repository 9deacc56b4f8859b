"""`--top-logprobs` / `--prompt-logprobs` (and the per-row fields) in the Parquet columns
and in OpenAI Chat Completions lines, against a transformers forward over the same text."""

from __future__ import annotations

import json

import torch
from jobs.jobkit import read_rows, run_cli, write_jsonl
from transformers import AutoModelForCausalLM, AutoTokenizer


def reference(model_dir, tokens):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def check_entry(entry, row, token, n, tokenizer):
    assert entry["token_id"] == token
    assert entry["token"] == tokenizer.decode([token])
    assert abs(entry["logprob"] - float(row[token])) <= 1e-5 * max(1.0, abs(float(row[token])))
    assert entry["rank"] == int((row > row[token]).sum()) + 1
    assert [a["token_id"] for a in entry["top_logprobs"]] == torch.topk(row, n).indices.tolist()


def test_parquet_columns_match_transformers(tmp_path, tiny_llama_dir):
    lines = [
        {"id": "a", "prompt": "The cat sat on the"},
        {"id": "b", "prompt": "The cat sat on the mat and", "top_logprobs": 1},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    args = ["--max-tokens", "3", "--top-logprobs", "3", "--prompt-logprobs", "2", "-q"]
    result = run_cli("run", source, output, "--model", tiny_llama_dir, "--save-tokens", *args)
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    for line, record in zip(lines, read_rows(output), strict=True):
        prompt = tokenizer(line["prompt"])["input_ids"]
        generated = record["completion_token_ids"]
        logprobs = reference(tiny_llama_dir, prompt + generated)
        n = line.get("top_logprobs", 3)
        assert len(record["top_logprobs"]) == len(generated)
        for k, entry in enumerate(record["top_logprobs"]):
            check_entry(entry, logprobs[len(prompt) - 1 + k], generated[k], n, tokenizer)
        assert record["prompt_logprobs"][0] is None
        assert len(record["prompt_logprobs"]) == len(prompt)
        for p in range(1, len(prompt)):
            check_entry(record["prompt_logprobs"][p], logprobs[p - 1], prompt[p], 2, tokenizer)


def test_openai_chat_lines_carry_top_logprobs(tmp_path, tiny_llama_dir):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": 2,
    }
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    source = write_jsonl(tmp_path / "in.jsonl", [line])
    output = tmp_path / "out.jsonl"
    result = run_cli(
        "run", source, output, "--model", tiny_llama_dir, "--output-format", "openai-jsonl", "-q"
    )
    assert result.exit_code == 0, result.output
    (response,) = [json.loads(x) for x in output.read_text().splitlines()]
    choice = response["response"]["body"]["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == response["response"]["body"]["usage"]["completion_tokens"]
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(item["top_logprobs"]) == 2
        assert item["bytes"] == list(item["token"].encode())
    assert "".join(item["token"] for item in content) == choice["message"]["content"]
