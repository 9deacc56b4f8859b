"""The results Parquet: one row per system per repeat, plus the floor, with machine info.

The scoring workload's rows (`score_session`) fill `pairs` and `pairs_per_second` and leave
the generation columns null.
Engine-only columns (prefill, cache, time to first token, KV pages, layout and seats,
forward time, overhead, steps, preemptions) are null on peer and floor rows; `repeat` is null on the
floor row; `peak_rss_bytes` is null on the floor row (it is computed, not run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.machine import MachineInfo
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.runs import SystemRun
from astrai_batch.errors import InputError
from astrai_batch.io import read_parquet_rows, write_table_atomic

RESULTS_FORMAT = "astrai-batch-bench/1"

RESULTS_SCHEMA = pa.schema(
    [
        ("started_at", pa.string()),  # UTC ISO time the invocation started
        ("system", pa.string()),  # astrai | astrai-contiguous | hf-generate | ... | floor
        ("repeat", pa.int32()),
        ("workload", pa.string()),
        ("workload_fingerprint", pa.string()),  # hash of the prompts' token ids and max_tokens
        ("model", pa.string()),
        ("dtype", pa.string()),
        ("seed", pa.int64()),
        ("num_prompts", pa.int64()),
        ("max_tokens", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("generated_tokens", pa.int64()),
        ("wall_seconds", pa.float64()),
        ("generated_tokens_per_second", pa.float64()),
        ("total_tokens_per_second", pa.float64()),
        ("pairs", pa.int64()),  # scoring: (context, continuation) pairs; else null
        ("pairs_per_second", pa.float64()),  # scoring: the throughput; else null
        ("ideal_prefill_tokens", pa.int64()),
        ("prefill_tokens", pa.int64()),
        ("prefill_ratio", pa.float64()),  # prefill_tokens / ideal_prefill_tokens
        ("ideal_cache_hit_rate", pa.float64()),
        ("cache_hit_rate", pa.float64()),
        ("ttft_p50_seconds", pa.float64()),
        ("ttft_p90_seconds", pa.float64()),
        ("peak_kv_pages", pa.int64()),
        ("kv_pool_pages", pa.int64()),
        ("kv_layout", pa.string()),  # paged | contiguous
        ("attention_backend", pa.string()),  # sdpa | flashinfer | flash-attn (resolved)
        ("kv_seats", pa.int64()),  # contiguous: seats the pool was cut into
        ("peak_running_seqs", pa.int64()),  # most sequences running at once
        ("peak_rss_bytes", pa.int64()),
        ("forward_seconds", pa.float64()),
        ("step_seconds", pa.float64()),  # inside engine steps (forward + scheduling + sampling)
        ("engine_overhead", pa.float64()),  # 1 - forward_seconds / wall_seconds
        ("steps", pa.int64()),
        ("preemptions", pa.int64()),
        # the roofline (`roofline`), on our rows: the run's weight-GEMM FLOPs and the GEMM
        # peak measured at bench start for the dtype and thread count
        ("weight_gemm_flops", pa.float64()),
        ("gemm_peak_flops_per_second", pa.float64()),
        # on a peer's rows that give tokens (llama-cpp): the share of its greedy tokens equal
        # to ours in the same repeat, position by position, and of those before each prompt's
        # first difference
        ("greedy_agreement", pa.float64()),
        ("greedy_leading_agreement", pa.float64()),
        ("page_size", pa.int64()),
        ("max_num_seqs", pa.int64()),
        ("max_num_batched_tokens", pa.int64()),
        ("max_model_len", pa.int64()),  # the engine's context cap (a contiguous seat's size)
        ("kv_layouts", pa.string()),  # the layouts this invocation ran, comma-separated
        ("system_config", pa.string()),  # the system's own settings, compact JSON
        ("load_average_1m", pa.float64()),  # when the run started
        ("cpu_model", pa.string()),
        ("cpu_cores", pa.int64()),
        ("torch_threads", pa.int64()),
        ("device", pa.string()),
        ("torch_version", pa.string()),
        ("transformers_version", pa.string()),
        ("astrai_batch_version", pa.string()),
        ("python_version", pa.string()),
    ]
)
RESULTS_COLUMNS = tuple(RESULTS_SCHEMA.names)


@dataclass(frozen=True)
class MeasuredRun:
    """A run and how loaded the machine was when it started."""

    run: SystemRun
    load_average_1m: float | None
    extra: Mapping[str, Any] = field(default_factory=dict)  # roofline or agreement columns


def result_row(
    measured: MeasuredRun,
    *,
    started_at: str,
    config: BenchConfig,
    prompts: BenchPrompts,
    machine: MachineInfo,
) -> dict[str, Any]:
    run = measured.run
    ideal = prompts.ideal
    row: dict[str, Any] = {
        "started_at": started_at,
        "system": run.system,
        "repeat": run.repeat,
        "workload": prompts.workload,
        "workload_fingerprint": prompts.fingerprint,
        "model": config.model,
        "dtype": config.dtype,
        "seed": config.seed,
        "num_prompts": prompts.num_prompts,
        "max_tokens": prompts.max_tokens,
        "prompt_tokens": run.prompt_tokens,
        "generated_tokens": run.generated_tokens,
        "wall_seconds": run.wall_seconds,
        "generated_tokens_per_second": run.generated_tokens_per_second,
        "total_tokens_per_second": run.total_tokens_per_second,
        "ideal_prefill_tokens": ideal.unique_tokens,
        "ideal_cache_hit_rate": ideal.predicted_prefill_saving,
        "peak_rss_bytes": run.peak_rss_bytes,
        "page_size": config.engine.page_size,
        "max_num_seqs": config.engine.max_num_seqs,
        "max_num_batched_tokens": config.engine.max_num_batched_tokens,
        "max_model_len": config.engine.max_model_len,
        "kv_layouts": ",".join(config.kv_layouts),
        "system_config": run.system_config,
        "load_average_1m": measured.load_average_1m,
        **machine.to_dict(),
    }
    row.update(_engine_columns(run, ideal.unique_tokens))
    row.update(measured.extra)
    return row


def _engine_columns(run: SystemRun, ideal_prefill: int) -> dict[str, Any]:
    engine = run.engine
    if engine is None:
        return {}
    return {
        "prefill_tokens": engine.prefill_tokens,
        "prefill_ratio": engine.prefill_tokens / ideal_prefill if ideal_prefill else None,
        "cache_hit_rate": engine.cache_hit_rate,
        "ttft_p50_seconds": engine.ttft_p50_seconds,
        "ttft_p90_seconds": engine.ttft_p90_seconds,
        "peak_kv_pages": engine.peak_kv_pages,
        "kv_pool_pages": engine.kv_pool_pages,
        "kv_layout": engine.kv_layout,
        "attention_backend": engine.attention_backend,
        "kv_seats": engine.kv_seats,
        "peak_running_seqs": engine.peak_running_seqs,
        "forward_seconds": engine.forward_seconds,
        "step_seconds": engine.step_seconds,
        "engine_overhead": run.engine_overhead,
        "steps": engine.steps,
        "preemptions": engine.preemptions,
    }


def results_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows as a table with exactly `RESULTS_SCHEMA`; missing columns are null."""
    unknown = sorted({key for row in rows for key in row} - set(RESULTS_COLUMNS))
    if unknown:
        raise ValueError(f"results rows have columns outside the schema: {', '.join(unknown)}")
    columns = {name: [row.get(name) for row in rows] for name in RESULTS_COLUMNS}
    return pa.Table.from_pydict(columns, schema=RESULTS_SCHEMA)


def write_results(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """Writes (atomically, replacing an earlier file) the results Parquet."""
    write_table_atomic(
        path, results_table(rows), metadata={"format": RESULTS_FORMAT}, overwrite=True
    )


def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of an earlier results file; raises `InputError` when it is not one."""
    rows = read_parquet_rows(path)
    if not rows:
        raise InputError(f"results file {path} holds no rows")
    missing = [name for name in ("system", "repeat") if name not in rows[0]]
    if missing:
        raise InputError(
            f"{path} is not an astrai-batch bench results file (no {', '.join(missing)} column)"
        )
    return rows
