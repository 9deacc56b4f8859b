"""One rule for empty inputs: an empty JSONL file (no lines, or blank ones only) and a
Parquet file without rows both give a valid output of no rows, exit 0, and a summary saying
0 rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, run_cli, summary_of

from astrai_batch.io.schemas import RESULT_SCHEMA


def empty_jsonl(path: Path) -> Path:
    path.write_text("")
    return path


def blank_jsonl(path: Path) -> Path:
    path.write_text("\n  \n")
    return path


def empty_parquet(path: Path) -> Path:
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    return path


@pytest.mark.parametrize("make", [empty_jsonl, blank_jsonl, empty_parquet])
def test_an_empty_input_gives_an_output_of_no_rows(
    tiny_llama_dir: Path, tmp_path: Path, make
) -> None:
    suffix = ".parquet" if make is empty_parquet else ".jsonl"
    source = make(tmp_path / f"in{suffix}")
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert (summary["status"], summary["rows"], summary["output_rows"]) == ("completed", 0, 0)
    table = pq.read_table(output)
    assert table.num_rows == 0
    assert table.schema.names[: len(RESULT_SCHEMA)] == RESULT_SCHEMA.names
    assert pq.read_table(tmp_path / "out.stats.parquet").num_rows >= 1


def test_an_empty_jsonl_with_named_columns_and_openai_output(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = empty_jsonl(tmp_path / "in.jsonl")
    output = tmp_path / "out.jsonl"
    args = ["--prompt-column", "text", "--id-column", "key", "--keep-columns", "meta"]
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir), *args)
    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["rows"] == 0
    assert output.read_text() == ""
    parquet = tmp_path / "out2.parquet"
    result = run_cli("run", source, parquet, *engine_args(tiny_llama_dir), *args)
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(parquet).schema.field("meta").type == pa.string()
    assert json.loads(result.stdout)["rows_done"] == 0
