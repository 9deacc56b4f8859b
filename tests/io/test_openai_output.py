from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from astrai_batch.errors import OutputError
from astrai_batch.io import OpenAIBatchWriter, open_input, openai_response_body

HI = [{"role": "user", "content": "Hi"}]


def test_chat_body_with_two_samples() -> None:
    samples = [
        {"text": "Hello!", "finish_reason": "stop", "completion_tokens": 3},
        {"text": "Hey there", "finish_reason": "length", "completion_tokens": 4},
    ]
    body = openai_response_body(
        "chat",
        "tiny-llama",
        samples,
        prompt_tokens=12,
        created=1700000000,
        response_id="chatcmpl-1",
    )
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "tiny-llama",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "Hey there", "refusal": None},
                "logprobs": None,
                "finish_reason": "length",
            },
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        "system_fingerprint": None,
    }


def test_completion_body_with_logprobs_and_cached_tokens() -> None:
    sample = {
        "text": "Once upon",
        "finish_reason": "length",
        "completion_tokens": 2,
        "logprobs": [-0.25, float("-inf")],
        "tokens": ["Once", " upon"],
    }
    body = openai_response_body(
        "completion", "m", [sample], 5, 7, response_id="cmpl-x", cached_tokens=4
    )
    assert body == {
        "id": "cmpl-x",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "Once upon",
                "logprobs": {
                    "tokens": ["Once", " upon"],
                    "token_logprobs": [-0.25, -9999.0],
                    "top_logprobs": None,
                    "text_offset": [0, 4],
                },
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
        "system_fingerprint": None,
    }


def test_chat_logprobs_carry_token_bytes() -> None:
    sample = {
        "text": "é!",
        "finish_reason": "stop",
        "completion_tokens": 2,
        "logprobs": [-1.5, -0.125],
        "tokens": ["é", "!"],
    }
    [choice] = openai_response_body("chat", "m", [sample], 1, 0)["choices"]
    assert choice["logprobs"] == {
        "content": [
            {"token": "é", "logprob": -1.5, "bytes": [195, 169], "top_logprobs": []},
            {"token": "!", "logprob": -0.125, "bytes": [33], "top_logprobs": []},
        ],
        "refusal": None,
    }


def test_default_response_id_is_a_stable_content_hash() -> None:
    sample = {"text": "a", "finish_reason": "stop", "completion_tokens": 1}
    first = openai_response_body("chat", "m", [sample], 1, 0)["id"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", first)
    assert openai_response_body("chat", "m", [sample], 1, 0)["id"] == first
    assert openai_response_body("chat", "m", [sample], 2, 0)["id"] != first
    assert openai_response_body("completion", "m", [sample], 1, 0)["id"].startswith("cmpl-")


@pytest.mark.parametrize(
    ("kind", "samples", "message"),
    [
        ("embedding", [{}], "kind must be 'chat' or 'completion', got 'embedding'"),
        ("chat", [], "samples must hold at least one sample"),
        (
            "chat",
            [{"text": "", "finish_reason": "error", "completion_tokens": 0}],
            "sample 0 finish_reason must be 'stop' or 'length', got 'error'",
        ),
        (
            "chat",
            [{"text": "a", "finish_reason": "stop", "completion_tokens": 1, "logprobs": [-1.0]}],
            "sample 0 needs one token string per logprob in 'tokens'",
        ),
        (
            "completion",
            [
                {
                    "text": "a",
                    "finish_reason": "stop",
                    "completion_tokens": 1,
                    "logprobs": [float("nan")],
                    "tokens": ["a"],
                }
            ],
            "sample 0 has a logprob of nan",
        ),
    ],
)
def test_body_argument_errors(kind: str, samples: list, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        openai_response_body(kind, "m", samples, 1, 0)


def test_writer_lines_in_the_batch_output_shape(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    body = openai_response_body(
        "chat",
        "m",
        [{"text": "Yo", "finish_reason": "stop", "completion_tokens": 1}],
        2,
        0,
        response_id="chatcmpl-0",
    )
    with OpenAIBatchWriter(target) as writer:
        writer.write_response("req-a", body, index=0)
        writer.write_error("req-b", code="invalid_request", message="prompt is empty", index=1)
        assert not target.exists()
    assert writer.lines_written == 2
    lines = target.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "id": "batch_req_0",
            "custom_id": "req-a",
            "response": {"status_code": 200, "request_id": "req_0", "body": body},
            "error": None,
        },
        {
            "id": "batch_req_1",
            "custom_id": "req-b",
            "response": None,
            "error": {"code": "invalid_request", "message": "prompt is empty"},
        },
    ]
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_writer_is_atomic_and_refuses_an_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), OpenAIBatchWriter(target) as writer:
        writer.write_error("c", code="server_error", message="boom", index=0)
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    writer.check_invariants()
    target.write_text("old\n")
    message = f"output {target} already exists; pass --overwrite to replace it"
    with pytest.raises(OutputError, match=f"^{re.escape(message)}$"):
        OpenAIBatchWriter(target)
    with OpenAIBatchWriter(target, overwrite=True) as writer:
        writer.write_error("c", code="server_error", message="boom", index=3)
    assert json.loads(target.read_text())["id"] == "batch_req_3"


def test_openai_input_round_trips_custom_ids(tmp_path: Path, write_jsonl) -> None:
    requests = [
        {
            "custom_id": "task-é",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": HI},
        },
        {
            "custom_id": "task-2",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "m", "prompt": "Hi", "n": 2},
        },
        {
            "custom_id": "task-3",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": HI, "web_search_options": {}},
        },
    ]
    source = open_input(write_jsonl("batch.jsonl", requests))
    target = tmp_path / "out.jsonl"
    with OpenAIBatchWriter(target) as writer:
        for row in source.iter_rows():
            if row.error is not None:
                writer.write_error(
                    row.custom_id, code="invalid_request", message=row.error, index=row.index
                )
                continue
            samples = [
                {"text": f"answer {k}", "finish_reason": "stop", "completion_tokens": 2}
                for k in range(row.overrides.get("n", 1))
            ]
            body = openai_response_body(row.kind, "m", samples, 3, 0)
            writer.write_response(row.custom_id, body, index=row.index)
    output = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert [line["custom_id"] for line in output] == ["task-é", "task-2", "task-3"]
    assert [line["response"] and line["response"]["body"]["object"] for line in output] == [
        "chat.completion",
        "text_completion",
        None,
    ]
    assert len(output[1]["response"]["body"]["choices"]) == 2
    assert output[2]["error"] == {
        "code": "invalid_request",
        "message": "body.web_search_options cannot be honoured: a batch job has no web search",
    }
