"""Hugging Face layouts on disk, written with pyarrow exactly as their owners write them (no
network, no `datasets` needed): a dataset repository in the hub cache, what
`Dataset.save_to_disk` writes, and a `datasets` cache directory.

Checked against the real thing: the hub cache by huggingface_hub's own `scan_cache_dir` and
`snapshot_download(local_files_only=True)` (tests/io/test_hub_datasets.py); the `datasets`
layouts by `datasets.load_from_disk` / `load_dataset` themselves where `datasets` is installed
(tests/io/test_datasets_reference.py), and by reading datasets' source: `arrow_writer`
writes the IPC stream format, `Dataset.save_to_disk` contiguous shards named
``data-{i:05d}-of-{n:05d}.arrow`` listed in state.json's ``_data_files``, `naming`
``{name}-{split}[-{i:05d}-of-{n:05d}].arrow`` in the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def parquet_bytes(columns: dict[str, list[Any]], row_group_size: int | None = None) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=row_group_size)
    return buffer.getvalue()


def write_hub_dataset(
    cache: Path,
    repo: str,
    files: dict[str, bytes],
    *,
    commit: str = DEFAULT_COMMIT,
    ref: str | None = "main",
) -> Path:
    """A dataset repository's files in the hub cache as huggingface_hub lays them out:
    ``datasets--ORG--NAME/blobs/<sha256>``, ``snapshots/<commit>/<path>`` a relative link to
    the blob, ``refs/<ref>`` holding the commit. Returns the snapshot directory."""
    root = cache / ("datasets--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = root / "snapshots" / commit
    for relative, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


def _features(schema: pa.Schema) -> dict[str, Any]:
    """datasets' `Features` JSON for the simple types used here."""
    names = {pa.string(): "string", pa.large_string(): "large_string", pa.int64(): "int64"}
    return {
        field.name: {"dtype": names.get(field.type, str(field.type)), "_type": "Value"}
        for field in schema
    }


def write_arrow_stream(path: Path, table: pa.Table, batch_rows: int) -> None:
    """`table` as `datasets`' ArrowWriter writes it: the IPC stream format, its schema
    carrying the ``huggingface`` metadata, record batches of `batch_rows` rows."""
    metadata = {"huggingface": json.dumps({"info": {"features": _features(table.schema)}})}
    schema = table.schema.with_metadata(metadata)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in table.cast(schema).to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)


def contiguous_shards(table: pa.Table, shards: int) -> list[pa.Table]:
    """`Dataset.shard(num_shards, index, contiguous=True)` for every index."""
    size, extra = divmod(table.num_rows, shards)
    out, start = [], 0
    for index in range(shards):
        length = size + (1 if index < extra else 0)
        out.append(table.slice(start, length))
        start += length
    return out


def write_saved_dataset(directory: Path, table: pa.Table, shards: int, batch_rows: int) -> Path:
    """What `Dataset.save_to_disk(directory, num_shards=shards)` writes."""
    directory.mkdir(parents=True)
    names = [f"data-{index:05d}-of-{shards:05d}.arrow" for index in range(shards)]
    for name, part in zip(names, contiguous_shards(table, shards), strict=True):
        write_arrow_stream(directory / name, part, batch_rows)
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": "0f1e2d3c4b5a6978",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (directory / "state.json").write_text(json.dumps(state, indent=2))
    info = {"citation": "", "description": "", "features": _features(table.schema)}
    (directory / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return directory


def write_dataset_cache(
    directory: Path, name: str, splits: dict[str, pa.Table], shards: int = 1, batch_rows: int = 1000
) -> Path:
    """A `datasets` cache directory: dataset_info.json listing the splits, and each split as
    ``{name}-{split}.arrow`` or, sharded, ``{name}-{split}-{i:05d}-of-{n:05d}.arrow``."""
    directory.mkdir(parents=True)
    info_splits = {}
    for split, table in splits.items():
        parts = contiguous_shards(table, shards)
        if shards == 1:
            write_arrow_stream(directory / f"{name}-{split}.arrow", table, batch_rows)
        else:
            for index, part in enumerate(parts):
                file = directory / f"{name}-{split}-{index:05d}-of-{shards:05d}.arrow"
                write_arrow_stream(file, part, batch_rows)
        info_splits[split] = {
            "name": split,
            "num_bytes": 0,
            "num_examples": table.num_rows,
            "dataset_name": name,
            **({"shard_lengths": [part.num_rows for part in parts]} if shards > 1 else {}),
        }
    first = next(iter(splits.values()))
    info = {
        "builder_name": name,
        "dataset_name": name,
        "config_name": "default",
        "features": _features(first.schema),
        "splits": info_splits,
    }
    (directory / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return directory
