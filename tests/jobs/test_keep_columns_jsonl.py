"""`--keep-columns` on JSONL input keeps the values' JSON types in the Parquet output (numbers,
lists, objects as pyarrow infers them), not their text."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from jobs.jobkit import engine_args, question, run_cli, write_jsonl


def test_kept_numbers_lists_and_objects_keep_their_types(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    lines = [
        {
            "prompt": question(0),
            "num": 7,
            "w": 0.5,
            "tags": ["a", "b"],
            "meta": {"src": "x", "k": 1},
        },
        {"prompt": question(1), "num": 8, "w": 2, "tags": [], "meta": {"src": "y", "k": 2}},
        {"prompt": 5, "num": None, "w": None, "tags": None, "meta": None},  # an error row
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    keep = ["--keep-columns", "num,w,tags,meta"]
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir), *keep)
    assert result.exit_code == 0, result.stderr
    table = pq.read_table(output)
    schema = table.schema
    assert schema.field("num").type == pa.int64()
    assert schema.field("w").type == pa.float64()
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("meta").type == pa.struct([("src", pa.string()), ("k", pa.int64())])
    assert table.select(["num", "w", "tags", "meta"]).to_pylist() == [
        {"num": 7, "w": 0.5, "tags": ["a", "b"], "meta": {"src": "x", "k": 1}},
        {"num": 8, "w": 2.0, "tags": [], "meta": {"src": "y", "k": 2}},
        {"num": None, "w": None, "tags": None, "meta": None},
    ]
    assert table.column("error").to_pylist()[2] == "prompt must be a string, got integer"
