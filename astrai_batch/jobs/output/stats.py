"""Job statistics: what each checkpoint part cost, summed per window and over the job.

Row-derived numbers (input rows, failed rows, output rows, prompt and cached tokens) are
sums over the records themselves, so the stats file always agrees with the output's columns.
Engine-derived numbers (prefill computed, decode tokens, evictions, preemptions) are
differences of engine counters between two flushes; `peak_kv_pages` is the engine's running
maximum at the flush, so a window's value is the highest reached up to its end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from astrai_batch.engine.types import EngineStats
from astrai_batch.errors import CheckpointError
from astrai_batch.io import STATS_SCHEMA


@dataclass(frozen=True)
class WorkStats:
    """Counts for some stretch of a job (one part, one window, a whole run)."""

    input_rows: int = 0
    output_rows: int = 0
    failed_rows: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    evicted_pages: int = 0
    preemptions: int = 0
    peak_kv_pages: int = 0
    wall_seconds: float = 0.0
    constrained_rows: int = 0  # rows with an output constraint (run or failed to compile)
    grammars_compiled: int = 0  # distinct constraints compiled (each once per run)
    grammar_compile_seconds: float = 0.0
    mask_fill_seconds: float = 0.0  # filling grammar masks, beside the forward
    images_encoded: int = 0  # images run through a vision tower
    image_encodes_saved: int = 0  # images whose features the encoder cache served
    image_tokens_cached: int = 0  # image placeholder tokens read from the prefix cache

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{f.name} must be a non-negative number, got {value!r}")

    def __add__(self, other: WorkStats) -> WorkStats:
        values = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = max(mine, theirs) if f.name == "peak_kv_pages" else mine + theirs
        return WorkStats(**values)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkStats:
        known = {f.name for f in dataclasses.fields(cls)}
        # a checkpoint written before the image counters lacks them (zero: no images ran)
        if isinstance(data, Mapping) and set(data) | _ADDED_LATER == known:
            data = {**dict.fromkeys(_ADDED_LATER, 0), **data}
        if not isinstance(data, Mapping) or set(data) != known:
            raise CheckpointError(f"checkpoint stats entry is damaged: {data!r}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint stats entry is damaged: {exc}") from exc


_ADDED_LATER = frozenset({"images_encoded", "image_encodes_saved", "image_tokens_cached"})


def total(stats: Iterable[WorkStats]) -> WorkStats:
    out = WorkStats()
    for item in stats:
        out = out + item
    return out


def records_stats(records: Iterable[Mapping[str, Any]]) -> WorkStats:
    """The row-derived counts of a batch of part records (input rows counted once)."""
    input_rows = output_rows = failed = prompt = cached = completion = 0
    for record in records:
        output_rows += 1
        if record["sample_index"] == 0:
            input_rows += 1
            if record["finish_reason"] == "error":
                failed += 1
        prompt += record["prompt_tokens"] or 0
        cached += record["cached_tokens"] or 0
        completion += record["completion_tokens"] or 0
    return WorkStats(
        input_rows=input_rows,
        output_rows=output_rows,
        failed_rows=failed,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
    )


def engine_stats(before: EngineStats, after: EngineStats, wall_seconds: float) -> WorkStats:
    """The engine-derived counts between two snapshots of one engine."""
    delta = after - before
    return WorkStats(
        prefill_tokens_computed=delta.prefill_tokens,
        decode_tokens=delta.decode_tokens,
        evicted_pages=delta.cache.evicted_pages,
        preemptions=delta.preemptions,
        peak_kv_pages=after.cache.peak_pages_in_use,
        wall_seconds=max(wall_seconds, 0.0),
        constrained_rows=delta.constrained_requests,
        grammars_compiled=delta.grammars_compiled,
        grammar_compile_seconds=max(delta.grammar_compile_seconds, 0.0),
        mask_fill_seconds=max(delta.mask_fill_seconds, 0.0),
        images_encoded=delta.images_encoded,
        image_encodes_saved=delta.image_encodes_saved,
        image_tokens_cached=delta.image_tokens_cached,
    )


def stats_row(window: int | None, stats: WorkStats) -> dict[str, Any]:
    """One row of the stats file; `window` None is the total row."""
    return {
        "window": window,
        "is_total": window is None,
        "rows": stats.input_rows,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "hit_rate": stats.hit_rate,
        "prefill_tokens_computed": stats.prefill_tokens_computed,
        "decode_tokens": stats.decode_tokens,
        "evicted_pages": stats.evicted_pages,
        "preemptions": stats.preemptions,
        "peak_kv_pages": stats.peak_kv_pages,
        "wall_seconds": stats.wall_seconds,
        "tokens_per_second": stats.tokens_per_second,
        "constrained_rows": stats.constrained_rows,
        "grammars_compiled": stats.grammars_compiled,
        "grammar_compile_seconds": stats.grammar_compile_seconds,
        "mask_fill_seconds": stats.mask_fill_seconds,
        "images_encoded": stats.images_encoded,
        "image_encodes_saved": stats.image_encodes_saved,
        "image_tokens_cached": stats.image_tokens_cached,
    }


def stats_table(windows: Mapping[int, WorkStats]) -> pa.Table:
    """The stats file: one row per window in window order, then the total row."""
    rows = [stats_row(number, windows[number]) for number in sorted(windows)]
    rows.append(stats_row(None, total(windows.values())))
    return pa.Table.from_pylist(rows, schema=STATS_SCHEMA)
