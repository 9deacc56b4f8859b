"""Bad rows become error rows and the job goes on; file-level problems stop it cleanly.

Exit codes: 0 done (even with failed rows), 3 with --fail-on-row-errors, 1 when --max-errors
is exceeded or the job cannot run, 2 for usage errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs.jobkit import (
    engine_args,
    listing,
    question,
    read_rows,
    run_cli,
    summary_of,
    write_jsonl,
)
from transformers import AutoTokenizer

LONG_PROMPT = "word " * 1100


def bad_rows_file(path: Path) -> Path:
    return write_jsonl(
        path,
        [
            {"id": "good-0", "prompt": question(0)},
            "{not json",
            {"id": "no-prompt", "text": "x"},
            {"id": "null", "prompt": None},
            {"id": "empty", "prompt": ""},
            {"id": "int", "prompt": 5},
            {"id": "long", "prompt": LONG_PROMPT},
            {"id": "hot", "prompt": question(7), "temperature": -1},
            {"id": "zero", "prompt": question(8), "max_tokens": 0},
            {"id": "good-9", "prompt": question(9)},
        ],
    )


def expected_errors(model_dir: Path) -> dict[str, str | None]:
    long_tokens = len(AutoTokenizer.from_pretrained(model_dir)(LONG_PROMPT)["input_ids"])
    return {
        "good-0": None,
        # The input has ids, so the unreadable line has none (never its row number).
        None: "line 2: invalid JSON: Expecting property name enclosed in double quotes at column 2",
        "no-prompt": "row has no prompt, messages, prompt_token_ids or body",
        "null": "prompt is missing",
        "empty": "prompt is empty",
        "int": "prompt must be a string, got integer",
        "long": f"prompt ({long_tokens} tokens) + max_tokens (4) = {long_tokens + 4} exceeds "
        "the model context of 1024 tokens",
        "hot": "invalid sampling parameters: temperature must be >= 0, got -1.0",
        "zero": "invalid sampling parameters: max_tokens must be >= 1, got 0",
        "good-9": None,
    }


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


def test_every_bad_row_gets_its_error_and_good_rows_complete(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = bad_rows_file(tmp_path / "in.jsonl")
    output = out_dir / "out.parquet"

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))

    assert result.exit_code == 0
    assert result.stderr == "astrai-batch: 8 of 10 rows failed\n"
    summary = summary_of(result.stdout)
    assert (summary["status"], summary["failed_rows"], summary["rows_done"]) == (
        "completed_with_errors",
        8,
        10,
    )
    rows = read_rows(output)
    assert {row["id"]: row["error"] for row in rows} == expected_errors(tiny_llama_dir)
    assert [row["id"] for row in rows][:2] == ["good-0", None]
    for row in rows:
        if row["error"] is None:
            assert row["finish_reason"] in ("stop", "length") and row["completion"] is not None
        else:
            assert (row["finish_reason"], row["completion"], row["completion_tokens"]) == (
                "error",
                None,
                None,
            )
    # Rows that were tokenized and planned keep their prefix group; unparsed rows have none.
    groups = {row["id"]: row["prefix_group"] for row in rows}
    assert groups["long"] is not None and groups["good-0"] is not None
    assert groups["int"] is None and groups["hot"] is None
    assert read_rows(out_dir / "out.stats.parquet")[-1]["rows"] == 10


def test_fail_on_row_errors_exits_3(tiny_llama_dir: Path, tmp_path: Path, out_dir: Path) -> None:
    source = bad_rows_file(tmp_path / "in.jsonl")
    args = (*engine_args(tiny_llama_dir), "--fail-on-row-errors")
    result = run_cli("run", source, out_dir / "out.parquet", *args)
    assert result.exit_code == 3
    assert summary_of(result.stdout)["exit_code"] == 3
    assert listing(out_dir) == ["out.parquet", "out.stats.parquet"]

    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": question(1)}])
    assert run_cli("run", good, out_dir / "good.parquet", *args).exit_code == 0


def test_max_errors_aborts_keeping_the_checkpoint_and_a_rerun_resumes(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = bad_rows_file(tmp_path / "in.jsonl")
    output = out_dir / "out.parquet"

    aborted = run_cli("run", source, output, *engine_args(tiny_llama_dir), "--max-errors", "5")

    assert aborted.exit_code == 1
    assert aborted.stderr == (
        "Error: 6 rows failed, more than --max-errors 5 allows (5 of 10 rows); the last: row "
        "'hot': invalid sampling parameters: temperature must be >= 0, got -1.0\n"
    )
    summary = summary_of(aborted.stdout)
    assert (summary["status"], summary["output"], summary["failed_rows"]) == ("aborted", None, 6)
    assert listing(out_dir) == [".out.parquet.ckpt"]

    resumed = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert resumed.exit_code == 0
    assert summary_of(resumed.stdout)["resumed_rows"] == 6
    assert {row["id"]: row["error"] for row in read_rows(output)} == expected_errors(tiny_llama_dir)


@pytest.mark.parametrize(("limit", "exit_code"), [("8", 0), ("7", 1), ("90%", 0), ("0.5", 1)])
def test_max_errors_as_count_or_fraction(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path, limit: str, exit_code: int
) -> None:
    source = bad_rows_file(tmp_path / "in.jsonl")
    args = (*engine_args(tiny_llama_dir), "--max-errors", limit)
    assert run_cli("run", source, out_dir / "out.parquet", *args).exit_code == exit_code


def test_bad_option_values_are_usage_errors(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = bad_rows_file(tmp_path / "in.jsonl")
    cases = {
        ("--temperature", "-1"): "temperature must be >= 0, got -1.0",
        ("--kv-cache-memory", "lots"): "kv_cache_memory must be a size like 2GiB, 512MiB, "
        "1.5GB or a byte count, got 'lots'",
        ("--max-errors", "many"): "max_errors must be a count, a fraction or a percentage, "
        "got 'many'",
        ("--group-window", "0"): "group_window must be >= 1, got 0",
    }
    for flags, message in cases.items():
        result = run_cli("run", source, tmp_path / "out.parquet", "--model", tiny_llama_dir, *flags)
        assert result.exit_code == 2
        assert f"Error: {message}\n" in result.stderr
    assert not (tmp_path / "out.parquet").exists()


def file_error_cases(tmp_path: Path, model_dir: Path) -> list[tuple[list[object], str]]:
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": question(1)}])
    garbage = tmp_path / "broken.parquet"
    garbage.write_bytes(b"PAR1 this is not a parquet file")
    no_prompt = write_jsonl(tmp_path / "noprompt.jsonl", [{"text": "hello"}])
    existing = tmp_path / "out" / "exists.parquet"
    existing.write_bytes(b"keep me")
    missing = tmp_path / "missing.jsonl"
    return [
        ([missing, tmp_path / "out" / "a.parquet"], f"input not found: {missing}"),
        ([garbage, tmp_path / "out" / "b.parquet"], "cannot read Parquet file broken.parquet: "),
        (
            [no_prompt, tmp_path / "out" / "c.parquet"],
            "no prompt column found in noprompt.jsonl: expected one of prompt, messages, "
            "prompt_token_ids, custom_id+body (or pass --prompt-column); columns are: text",
        ),
        (
            [good, tmp_path / "out" / "d.parquet", "--model", tmp_path / "no-such-model"],
            f"Model not found: there is no file or directory at {tmp_path / 'no-such-model'}",
        ),
        (
            [good, existing],
            f"output {existing} already exists; pass --overwrite to replace it",
        ),
        (
            [good, tmp_path / "nowhere" / "e.parquet"],
            f"output directory does not exist: {tmp_path / 'nowhere'}",
        ),
    ]


def test_file_level_errors_give_one_message_and_leave_nothing(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    for args, message in file_error_cases(tmp_path, tiny_llama_dir):
        before = listing(tmp_path), listing(out_dir)
        result = run_cli("run", *args[:2], *engine_args(tiny_llama_dir), *args[2:])
        assert result.exit_code == 1, message
        assert result.stderr.startswith(f"Error: {message}"), result.stderr
        assert result.stdout == ""
        assert (listing(tmp_path), listing(out_dir)) == before
    assert (out_dir / "exists.parquet").read_bytes() == b"keep me"
