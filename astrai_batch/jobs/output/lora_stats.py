"""Per-adapter counts of a job with LoRA adapters: rows, failed rows, prompt, cached and
completion tokens of each adapter (and of the base model), summed over the records
themselves, so they always agree with the output's `lora` column. They go into the summary
(`lora`: one entry per adapter, `adapter` null for the base model) and into the stats file
as extra rows (`lora` column: the adapter; window null, is_total false)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from astrai_batch.jobs.planning.window import LORA_COLUMN

COUNTS = ("rows", "failed_rows", "prompt_tokens", "cached_tokens", "completion_tokens")
SOURCE_COLUMNS = [
    LORA_COLUMN,
    "sample_index",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
]


def adapter_counts(tables: Iterable[pa.Table], names: Iterable[str]) -> list[dict[str, Any]]:
    """One entry per adapter of the job, the base model first, in the job's order."""
    counts: dict[str | None, dict[str, int]] = {None: dict.fromkeys(COUNTS, 0)}
    for name in names:
        counts[name] = dict.fromkeys(COUNTS, 0)
    for table in tables:
        for record in table.select(SOURCE_COLUMNS).to_pylist():
            entry = counts.get(record[LORA_COLUMN])
            if entry is None:  # a row naming an unknown adapter: it failed, on the base
                entry = counts[None]
            if record["sample_index"] == 0:
                entry["rows"] += 1
                entry["failed_rows"] += record["finish_reason"] == "error"
            for name in ("prompt_tokens", "cached_tokens", "completion_tokens"):
                entry[name] += record[name] or 0
    return [{"adapter": name, **entry} for name, entry in counts.items()]


def with_adapter_rows(stats: pa.Table, counts: list[dict[str, Any]]) -> pa.Table:
    """The stats table plus a `lora` column and one row per adapter."""
    rows = stats.to_pylist()
    for row in rows:
        row[LORA_COLUMN] = None
    for entry in counts:
        prompt = entry["prompt_tokens"]
        rows.append(
            {
                "window": None,
                "is_total": False,
                LORA_COLUMN: entry["adapter"],
                "rows": entry["rows"],
                "prompt_tokens": prompt,
                "cached_tokens": entry["cached_tokens"],
                "hit_rate": entry["cached_tokens"] / prompt if prompt else 0.0,
            }
        )
    schema = stats.schema.append(pa.field(LORA_COLUMN, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)
