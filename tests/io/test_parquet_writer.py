from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import OutputError
from astrai_batch.io import (
    RESULT_SCHEMA,
    STATS_SCHEMA,
    ParquetRowWriter,
    read_parquet_metadata,
    read_parquet_rows,
    result_schema,
    write_table_atomic,
)


def result_row(i: int, **changes: Any) -> dict[str, Any]:
    row = {
        "id": f"r{i}",
        "sample_index": 0,
        "completion": f"text {i}",
        "finish_reason": "stop",
        "prompt_tokens": 10 + i,
        "cached_tokens": i,
        "completion_tokens": 3,
        "prefix_group": i // 2,
        "error": None,
    }
    row.update(changes)
    return row


def exists_message(path: Path) -> str:
    return f"^{re.escape(f'output {path} already exists; pass --overwrite to replace it')}$"


def test_rows_round_trip_in_full_row_groups(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    rows = [result_row(i) for i in range(7)]
    with ParquetRowWriter(target, RESULT_SCHEMA, row_group_size=3) as writer:
        writer.write_rows(rows[:2])
        writer.write_rows(rows[2:6])
        writer.check_invariants()
        writer.write_rows(rows[6:])
        writer.write_rows([])
        assert not target.exists()
    assert writer.state == "committed"
    assert writer.rows_written == 7
    writer.check_invariants()
    assert read_parquet_rows(target) == rows
    metadata = pq.ParquetFile(target).metadata
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [3, 3, 1]
    assert pq.read_schema(target).remove_metadata() == RESULT_SCHEMA
    assert sorted(os.listdir(tmp_path)) == ["results.parquet"]


def test_optional_columns_and_kept_values(tmp_path: Path) -> None:
    schema = result_schema(True, True, pa.schema([("topic", pa.string())]))
    row = result_row(0, completion_token_ids=[5, 6], logprobs=[-0.5, -1.25], topic="math")
    target = tmp_path / "results.parquet"
    with ParquetRowWriter(target, schema) as writer:
        writer.write_rows([row])
    assert read_parquet_rows(target) == [row]
    assert pq.read_schema(target).remove_metadata() == schema


def test_metadata_round_trip(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    metadata = {"astrai_batch.job": json.dumps({"model": "tiny", "seed": 1}), "note": '"x"'}
    with ParquetRowWriter(target, RESULT_SCHEMA, metadata=metadata) as writer:
        writer.write_rows([result_row(0)])
    assert read_parquet_metadata(target) == metadata
    with pytest.raises(ValueError, match=r"^metadata keys and values must be strings"):
        ParquetRowWriter(tmp_path / "other.parquet", RESULT_SCHEMA, metadata={"k": 1})


def test_exception_mid_write_leaves_no_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    with (
        pytest.raises(RuntimeError, match=r"^generation failed$"),
        ParquetRowWriter(target, RESULT_SCHEMA, row_group_size=2) as writer,
    ):
        writer.write_rows([result_row(i) for i in range(5)])  # two row groups on disk
        assert len(list(tmp_path.iterdir())) == 1
        raise RuntimeError("generation failed")
    assert writer.state == "aborted"
    writer.check_invariants()
    assert list(tmp_path.iterdir()) == []


def test_exception_leaves_an_existing_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    target.write_bytes(b"previous results")
    with (
        pytest.raises(KeyboardInterrupt),
        ParquetRowWriter(target, RESULT_SCHEMA, overwrite=True) as writer,
    ):
        writer.write_rows([result_row(0)])
        raise KeyboardInterrupt
    assert target.read_bytes() == b"previous results"
    assert os.listdir(tmp_path) == ["results.parquet"]


def test_overwrite_replaces_the_target(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    target.write_bytes(b"old")
    with ParquetRowWriter(target, RESULT_SCHEMA, overwrite=True) as writer:
        writer.write_rows([result_row(1)])
    assert read_parquet_rows(target) == [result_row(1)]


def test_existing_target_is_refused_at_open_and_at_commit(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    target.write_bytes(b"old")
    with pytest.raises(OutputError, match=exists_message(target)):
        ParquetRowWriter(target, RESULT_SCHEMA)
    assert os.listdir(tmp_path) == ["results.parquet"]

    late = tmp_path / "late.parquet"
    writer = ParquetRowWriter(late, RESULT_SCHEMA)
    writer.write_rows([result_row(0)])
    late.write_bytes(b"someone else's")
    with pytest.raises(OutputError, match=exists_message(late)):
        writer.commit()
    assert late.read_bytes() == b"someone else's"
    assert writer.state == "aborted"
    assert sorted(os.listdir(tmp_path)) == ["late.parquet", "results.parquet"]


def test_abort_and_use_after_close(tmp_path: Path) -> None:
    target = tmp_path / "results.parquet"
    writer = ParquetRowWriter(target, RESULT_SCHEMA)
    writer.write_rows([result_row(0)])
    writer.abort()
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OutputError, match=f"^{re.escape(f'output {target} is already aborted')}$"):
        writer.write_rows([result_row(1)])
    with pytest.raises(OutputError, match=r"is already aborted$"):
        writer.commit()


def test_temp_file_sits_beside_the_target_with_a_hidden_name(tmp_path: Path) -> None:
    writer = ParquetRowWriter(tmp_path / "results.parquet", RESULT_SCHEMA)
    [temp] = tmp_path.iterdir()
    assert re.fullmatch(rf"\.results\.parquet\.tmp-{os.getpid()}-[0-9a-f]{{8}}", temp.name)
    writer.abort()


def test_rows_must_match_the_schema(tmp_path: Path) -> None:
    writer = ParquetRowWriter(tmp_path / "results.parquet", RESULT_SCHEMA)
    bad_keys = result_row(0, extra=1)
    del bad_keys["error"]
    with pytest.raises(
        OutputError,
        match=r"^row 1 does not match the output schema: missing \['error'\], unknown \['extra'\]$",
    ):
        writer.write_rows([result_row(0), bad_keys])
    with pytest.raises(OutputError, match=r"^rows do not fit the output schema: "):
        writer.write_rows([result_row(0, prompt_tokens="ten")])
    with pytest.raises(OutputError, match=r"^column 'finish_reason' must not be null$"):
        writer.write_rows([result_row(0, finish_reason=None)])
    assert writer.rows_written == 0
    writer.commit()
    assert read_parquet_rows(tmp_path / "results.parquet") == []


def test_commit_fsyncs_the_file_then_renames_then_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spies that record and then call the real functions.
    events: list[tuple[str, Any]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        info = os.fstat(descriptor)
        events.append(("fsync", ("dir" if stat.S_ISDIR(info.st_mode) else "file", info.st_ino)))
        real_fsync(descriptor)

    def replace(source: Any, destination: Any) -> None:
        events.append(("replace", (Path(source).name, Path(destination).name)))
        real_replace(source, destination)

    target = tmp_path / "results.parquet"
    writer = ParquetRowWriter(target, RESULT_SCHEMA)
    writer.write_rows([result_row(0)])
    [temp] = tmp_path.iterdir()
    temp_inode = temp.stat().st_ino
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    writer.commit()
    assert events == [
        ("fsync", ("file", temp_inode)),
        ("replace", (temp.name, "results.parquet")),
        ("fsync", ("dir", tmp_path.stat().st_ino)),
    ]
    assert target.stat().st_ino == temp_inode


def test_missing_output_directory(tmp_path: Path) -> None:
    target = tmp_path / "no" / "results.parquet"
    with pytest.raises(
        OutputError, match=f"^{re.escape(f'output directory does not exist: {target.parent}')}$"
    ):
        ParquetRowWriter(target, RESULT_SCHEMA)


def test_row_group_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^row_group_size must be >= 1, got 0$"):
        ParquetRowWriter(tmp_path / "r.parquet", RESULT_SCHEMA, row_group_size=0)


def test_write_table_atomic(tmp_path: Path) -> None:
    target = tmp_path / "stats.parquet"
    table = pa.Table.from_pylist(
        [
            {"window": 0, "is_total": False, "rows": 4, "hit_rate": 0.5},
            {"window": None, "is_total": True, "rows": 4, "hit_rate": 0.5},
        ],
        schema=STATS_SCHEMA,
    )
    write_table_atomic(target, table, metadata={"job": "{}"})
    assert read_parquet_rows(target) == table.to_pylist()
    assert read_parquet_metadata(target) == {"job": "{}"}
    assert pq.read_schema(target).remove_metadata() == STATS_SCHEMA
    with pytest.raises(OutputError, match=exists_message(target)):
        write_table_atomic(target, table)
    write_table_atomic(target, table.slice(1), overwrite=True)
    assert read_parquet_rows(target) == table.slice(1).to_pylist()
    assert os.listdir(tmp_path) == ["stats.parquet"]
