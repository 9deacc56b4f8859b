"""`--output-format parquet-dir`: parts in input order plus an index written last."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from jobs.jobkit import engine_args, listing, run_cli, shared_prefix_prompts, write_jsonl


def test_a_directory_output_reads_as_the_single_file_output(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    rows = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(12))]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    single, directory = tmp_path / "out.parquet", tmp_path / "out-dir"
    directory.mkdir()  # an empty directory may be the output: nothing in it is replaced

    assert run_cli("run", source, single, *engine_args(tiny_llama_dir)).exit_code == 0
    result = run_cli(
        "run", source, directory, *engine_args(tiny_llama_dir), "--output-format", "parquet-dir"
    )

    assert result.exit_code == 0, result.stderr
    assert listing(directory) == ["_index.json", "part-00000.parquet"]
    index = json.loads((directory / "_index.json").read_text())
    assert index["rows"] == 12
    assert index["parts"] == [{"file": "part-00000.parquet", "first_row": 0, "rows": 12}]
    expected = pq.read_table(single)
    got = pq.read_table(directory / "part-00000.parquet")
    assert got.schema == expected.schema
    columns = ["id", "completion", "prefix_group", "error"]
    assert got.select(columns).to_pylist() == expected.select(columns).to_pylist()
    assert (tmp_path / "out-dir.stats.parquet").exists()

    again = run_cli(
        "run", source, directory, *engine_args(tiny_llama_dir), "--output-format", "parquet-dir"
    )
    assert again.exit_code == 1
    assert again.stderr == (
        f"Error: output {directory} already exists; pass --overwrite to replace it\n"
    )
