"""`astrai-batch run` with mixed rows, repeated ids and per-row decoding options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from jobs.jobkit import engine_args, question, read_rows, run_cli, write_jsonl, write_parquet


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


def chat(custom_id: str, text: str) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": text}]},
    }


def test_openai_output_never_repeats_a_custom_id(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(
        tmp_path / "batch.jsonl",
        [
            chat("a", question(1)),
            {"id": "b", "prompt": question(2)},  # a prompt row between requests
            chat("a", question(3)),
            {"custom_id": "c", "body": {"prompt": question(4)}},
            {"prompt": question(5)},
        ],
    )
    output = out_dir / "out.jsonl"
    result = run_cli(
        "run", source, output, *engine_args(tiny_llama_dir), "--output-format", "openai-jsonl"
    )
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(line["custom_id"], line["error"]) for line in lines] == [
        ("a", None),
        ("b", None),
        (None, {"code": "invalid_request", "message": "duplicate id 'a' (first at row 0)"}),
        ("c", None),
        (None, {"code": "invalid_request", "message": "id is missing"}),
    ]
    assert [line["response"]["body"]["object"] for line in lines if line["error"] is None] == [
        "chat.completion",
        "text_completion",
        "text_completion",
    ]


def test_parquet_duplicate_ids_become_error_rows_with_a_null_id(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_parquet(
        tmp_path / "in.parquet",
        {"id": [10, 11, 10], "prompt": [question(1), question(2), question(3)]},
    )
    output = out_dir / "out.parquet"
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    rows = read_rows(output)
    assert [(row["id"], row["finish_reason"], row["error"]) for row in rows] == [
        ("10", rows[0]["finish_reason"], None),
        ("11", rows[1]["finish_reason"], None),
        (None, "error", "duplicate id '10' (first at row 0)"),
    ]
    assert {rows[0]["finish_reason"], rows[1]["finish_reason"]} <= {"stop", "length"}


def test_per_row_stop_token_ids(tiny_llama_dir: Path, tmp_path: Path, out_dir: Path) -> None:
    prompt = question(6)
    baseline = _completion_ids(tiny_llama_dir, tmp_path, out_dir, [{"id": "b", "prompt": prompt}])
    stop = baseline[2]
    stop_at = baseline.index(stop)
    rows = _run_rows(
        tiny_llama_dir,
        tmp_path,
        out_dir,
        [
            {"id": "stops", "prompt": prompt, "stop_token_ids": [stop]},
            {"id": "runs", "prompt": prompt},
            {"id": "bad", "prompt": prompt, "stop_token_ids": [-1]},
        ],
    )
    assert (rows[0]["finish_reason"], rows[0]["completion_token_ids"]) == (
        "stop",
        baseline[: stop_at + 1],
    )
    assert rows[1]["completion_token_ids"] == baseline
    assert rows[2]["error"] == (
        "invalid sampling parameters: stop_token_ids[0] must be a non-negative integer, got -1"
    )


def test_per_row_ignore_eos(tiny_llama_dir: Path, tmp_path: Path, out_dir: Path) -> None:
    prompt = question(6)
    baseline = _completion_ids(tiny_llama_dir, tmp_path, out_dir, [{"id": "b", "prompt": prompt}])
    # The same weights, with the first token this prompt generates declared end-of-sequence.
    model = shutil.copytree(tiny_llama_dir, tmp_path / "eos-model")
    for name in ("config.json", "generation_config.json"):
        settings = json.loads((model / name).read_text())
        settings["eos_token_id"] = baseline[0]
        (model / name).write_text(json.dumps(settings))
    rows = _run_rows(
        model,
        tmp_path,
        out_dir,
        [
            {"id": "ends", "prompt": prompt},
            {"id": "ignores", "prompt": prompt, "ignore_eos": True},
            {"id": "bad", "prompt": prompt, "ignore_eos": 1},
        ],
    )
    assert (rows[0]["finish_reason"], rows[0]["completion_token_ids"]) == ("stop", baseline[:1])
    assert (rows[1]["finish_reason"], rows[1]["completion_token_ids"]) == ("length", baseline)
    assert rows[2]["error"] == (
        "invalid sampling parameters: ignore_eos must be a boolean, got integer"
    )


def _run_rows(model: Path, tmp_path: Path, out_dir: Path, lines: list[dict]) -> list[dict]:
    source = write_jsonl(tmp_path / "rows.jsonl", lines)
    output = out_dir / "rows.parquet"
    args = (*engine_args(model), "--max-tokens", "6", "--save-tokens", "--overwrite")
    result = run_cli("run", source, output, *args)
    assert result.exit_code == 0, result.stderr
    return read_rows(output)


def _completion_ids(model: Path, tmp_path: Path, out_dir: Path, lines: list[dict]) -> list[int]:
    (row,) = _run_rows(model, tmp_path, out_dir, lines)
    assert row["finish_reason"] == "length" and len(set(row["completion_token_ids"])) > 2
    return row["completion_token_ids"]
