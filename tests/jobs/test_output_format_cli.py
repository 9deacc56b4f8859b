"""The output format follows OUTPUT's name (`.parquet`, `.jsonl`, a directory); a name that
tells nothing needs `--output-format`, and a flag the name contradicts is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, listing, question, run_cli, summary_of, write_jsonl

from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.io_options import output_format_for

PARQUET_MAGIC = b"PAR1"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": question(i)} for i in range(3)]
    )


def test_jsonl_output_name_writes_openai_jsonl_lines(
    tiny_llama_dir: Path, source: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out.jsonl"
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    assert not output.read_bytes().startswith(PARQUET_MAGIC)
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["r0", "r1", "r2"]
    assert summary_of(result.stdout)["output_format"] == "openai-jsonl"


def test_parquet_name_and_directory_name(
    tiny_llama_dir: Path, source: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out.PARQUET"
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    assert output.read_bytes().startswith(PARQUET_MAGIC)
    folder = tmp_path / "folder"
    result = run_cli("run", source, f"{folder}/", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["output_format"] == "parquet-dir"
    assert pq.read_table(folder).num_rows == 3


@pytest.mark.parametrize(
    ("name", "flag", "expected"),
    [
        (
            "out.txt",
            None,
            "Error: cannot tell the output format from the name 'out.txt'; name it .parquet or "
            ".jsonl, or a directory (ending in /), or give "
            "--output-format parquet|openai-jsonl|parquet-dir",
        ),
        (
            "out.jsonl",
            "parquet",
            "Error: --output-format parquet contradicts the output name 'out.jsonl' (.jsonl is "
            "openai-jsonl); give the output a matching name or drop --output-format",
        ),
        (
            "out.parquet",
            "openai-jsonl",
            "Error: --output-format openai-jsonl contradicts the output name 'out.parquet' "
            "(.parquet is parquet); give the output a matching name or drop --output-format",
        ),
    ],
)
def test_unknown_or_contradicted_names_are_refused_in_one_line(
    tiny_llama_dir: Path, source: Path, tmp_path: Path, name: str, flag: str | None, expected: str
) -> None:
    (tmp_path / "out").mkdir()
    args = ["--output-format", flag] if flag else []
    result = run_cli("run", source, tmp_path / "out" / name, *engine_args(tiny_llama_dir), *args)
    assert result.exit_code == 1
    assert result.stderr.strip() == expected
    assert result.stdout == ""
    assert listing(tmp_path / "out") == []


def test_format_rules() -> None:
    assert output_format_for("a.parquet", directory=False, given=None) == "parquet"
    assert output_format_for("a.jsonl", directory=False, given=None) == "openai-jsonl"
    assert output_format_for("a", directory=True, given=None) == "parquet-dir"
    # a Spark-style directory named .parquet, and a name that tells nothing, take the flag
    assert output_format_for("a.parquet", directory=True, given="parquet-dir") == "parquet-dir"
    assert output_format_for("results", directory=False, given="parquet") == "parquet"
    assert output_format_for("a.out", directory=False, given="openai-jsonl") == "openai-jsonl"
    with pytest.raises(ConfigError, match="contradicts"):
        output_format_for("a.jsonl", directory=False, given="parquet-dir")
    with pytest.raises(ConfigError, match="cannot tell"):
        output_format_for(".hidden", directory=False, given=None)
