"""Structured outputs through `astrai-batch run` and `plan`: row constraints, the job-wide
options and their per-row override, row errors, statistics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
from jobs.jobkit import question, read_rows, run_cli, summary_of, write_jsonl

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer"],
}


def args(model_dir: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--max-tokens", "40", "--kv-cache-memory", "8MiB",
            "--quiet", *extra]  # fmt: skip


def test_row_constraints_errors_and_stats(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = []
    for i in range(12):
        line = {"id": f"r{i}", "prompt": question(i)}
        kind = i % 4
        if kind == 0:
            line["json_schema"] = json.dumps(SCHEMA)
        elif kind == 1:
            line["choice"] = ["red", "green", "blue"]
        elif kind == 2:
            line["regex"] = "[a-z]{3}-[0-9]{2}"
        lines.append(line)
    lines.append({"id": "bad-regex", "prompt": "x", "regex": "(oops"})
    lines.append({"id": "bad-choice", "prompt": "x", "choice": "red"})
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"

    result = run_cli("run", source, output, *args(tiny_llama_dir))

    assert result.exit_code == 0, result.stderr
    rows = {row["id"]: row for row in read_rows(output)}
    assert rows["bad-regex"]["finish_reason"] == "error"
    assert rows["bad-regex"]["error"] == (
        "invalid regex: Regex parsing error at position 6: The parenthesis is not closed."
    )
    assert rows["bad-choice"]["error"] == "choice must be a list of strings, got string"
    finished = 0
    for i in range(12):
        row = rows[f"r{i}"]
        assert row["error"] is None
        if row["finish_reason"] == "length" or i % 4 == 3:
            continue
        finished += 1
        if i % 4 == 0:
            jsonschema.validate(json.loads(row["completion"]), SCHEMA)
        elif i % 4 == 1:
            assert row["completion"] in ("red", "green", "blue")
        else:
            assert re.fullmatch("[a-z]{3}-[0-9]{2}", row["completion"])
    assert finished >= 5
    summary = summary_of(result.stdout)
    assert (summary["constrained_rows"], summary["grammars_compiled"]) == (10, 4)
    assert summary["failed_rows"] == 2
    assert summary["grammar_compile_seconds"] > 0 and summary["mask_fill_seconds"] > 0
    total = read_rows(tmp_path / "out.stats.parquet")[-1]
    assert (total["constrained_rows"], total["grammars_compiled"]) == (10, 4)


def test_job_wide_choice_and_a_row_override(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = [{"id": f"r{i}", "prompt": question(i)} for i in range(5)]
    lines.append({"id": "own", "prompt": question(5), "regex": "[0-9]{4}"})
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"

    result = run_cli("run", source, output, *args(tiny_llama_dir, "--choice", "alpha, beta,gamma"))

    assert result.exit_code == 0, result.stderr
    rows = read_rows(output)
    assert all(row["completion"] in ("alpha", "beta", "gamma") for row in rows[:5])
    assert re.fullmatch("[0-9]{4}", rows[5]["completion"])
    assert summary_of(result.stdout)["grammars_compiled"] == 2


def test_job_wide_schema_file_and_option_errors(tiny_llama_dir: Path, tmp_path: Path) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA), encoding="utf-8")
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(3)])
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, *args(tiny_llama_dir, "--json-schema", schema_file))
    assert result.exit_code == 0, result.stderr
    for row in read_rows(output):
        if row["finish_reason"] == "stop":
            jsonschema.validate(json.loads(row["completion"]), SCHEMA)

    both = run_cli("run", source, output, *args(tiny_llama_dir, "--regex", "a", "--choice", "b"))
    assert both.exit_code == 2
    assert "only one job-wide constraint may be given, got --regex and --choice" in both.stderr
    missing = run_cli("run", source, output, *args(tiny_llama_dir, "--grammar", tmp_path / "no"))
    assert missing.exit_code == 2
    assert f"--grammar: file not found: {tmp_path / 'no'}" in missing.stderr


def test_plan_counts_distinct_constraints(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = [
        {"prompt": question(0), "json_schema": SCHEMA},
        {"prompt": question(1), "json_schema": json.dumps(SCHEMA, indent=2)},
        {"prompt": question(2), "choice": ["a", "b"]},
        {"prompt": question(3)},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    result = run_cli("plan", source, "--model", tiny_llama_dir, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["constrained_rows"], report["distinct_constraints"]) == (3, 2)
    text = run_cli("plan", source, "--model", tiny_llama_dir).stdout
    assert "output constraints        2 distinct over 3 rows (each compiled once)" in text


def test_a_schema_feature_that_cannot_be_enforced_fails_its_own_row(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    unenforced = {
        "type": "object",
        "properties": {"name": {"type": "string", "not": {"const": ""}}},
        "required": ["name"],
    }
    lines = [
        {"id": "good", "prompt": question(0), "json_schema": SCHEMA},
        {"id": "not", "prompt": question(1), "json_schema": unenforced},
        {"id": "again", "prompt": question(2), "json_schema": json.dumps(unenforced)},
        {"id": "free", "prompt": question(3)},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"

    result = run_cli("run", source, output, *args(tiny_llama_dir))

    assert result.exit_code == 0, result.stderr
    rows = {row["id"]: row for row in read_rows(output)}
    message = 'json_schema uses "not" at /properties/name, which structured outputs cannot enforce'
    for key in ("not", "again"):
        assert (rows[key]["finish_reason"], rows[key]["error"]) == ("error", message)
    for key in ("good", "free"):
        assert rows[key]["error"] is None
        assert rows[key]["finish_reason"] in ("stop", "length")
    if rows["good"]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(rows["good"]["completion"]), SCHEMA)
    summary = summary_of(result.stdout)
    assert (summary["failed_rows"], summary["constrained_rows"]) == (2, 3)
    assert summary["grammars_compiled"] == 2  # the good schema and the refused one, once each
