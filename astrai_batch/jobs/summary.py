"""The JSON summary a job prints on stdout at the end (and writes with --summary-json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_batch.io import AtomicFile
from astrai_batch.jobs.output.stats import WorkStats

STATUSES = ("completed", "completed_with_errors", "failed", "interrupted", "aborted")


@dataclass(frozen=True)
class JobSummary:
    """The outcome of a run. `totals` cover the whole job (checkpointed rows included);
    `run_*` only the work this process did."""

    status: str
    exit_code: int
    input: str
    output: str | None
    stats_output: str | None
    output_format: str
    model: str
    total_rows: int
    totals: WorkStats
    resumed_rows: int
    run_decode_tokens: int
    run_wall_seconds: float
    message: str | None = None
    # seconds this process spent running rows (the executor's run: no loading, no writing)
    run_generation_seconds: float = 0.0
    # torch CPU threads of this process's engine; None where the engines run on workers
    threads: int | None = None
    # the backend this process resolved `--attention-backend` to; None where workers resolve it
    attention_backend: str | None = None
    # the device and dtype the job ran on: `auto` resolved (`engine.device_choice`)
    device: str | None = None
    dtype: str | None = None
    dtype_choice: str | None = None  # why that dtype ("given", or what `auto` saw)
    # a LoRA job's per-adapter counts (`jobs/output/lora_stats`); None without adapters
    lora: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        totals = self.totals
        rate = self.run_decode_tokens / self.run_wall_seconds if self.run_wall_seconds > 0 else 0.0
        generation = self.run_generation_seconds
        generation_rate = self.run_decode_tokens / generation if generation > 0 else 0.0
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "input": self.input,
            "output": self.output,
            "stats_output": self.stats_output,
            "output_format": self.output_format,
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "dtype_choice": self.dtype_choice,
            "attention_backend": self.attention_backend,
            "threads": self.threads,
            "rows": self.total_rows,
            "rows_done": totals.input_rows,
            "resumed_rows": self.resumed_rows,
            "output_rows": totals.output_rows,
            "failed_rows": totals.failed_rows,
            "prompt_tokens": totals.prompt_tokens,
            "cached_tokens": totals.cached_tokens,
            "cache_hit_rate": totals.hit_rate,
            "completion_tokens": totals.completion_tokens,
            "constrained_rows": totals.constrained_rows,
            "grammars_compiled": totals.grammars_compiled,
            "grammar_compile_seconds": totals.grammar_compile_seconds,
            "mask_fill_seconds": totals.mask_fill_seconds,
            "images_encoded": totals.images_encoded,
            "image_encodes_saved": totals.image_encodes_saved,
            "image_tokens_cached": totals.image_tokens_cached,
            # two rates of the tokens this process generated: over its whole wall time
            # (loading and writing included), and over the time it spent running rows (the
            # rate the progress lines show)
            "wall_seconds": self.run_wall_seconds,
            "tokens_per_second": rate,
            "generation_seconds": generation,
            "generation_tokens_per_second": generation_rate,
        } | ({} if self.lora is None else {"lora": self.lora})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)


def write_summary(path: str | Path, summary: JobSummary) -> None:
    """Write the summary JSON to `path` atomically (replacing an older summary)."""
    target = AtomicFile(path, overwrite=True)
    try:
        target.handle.write((summary.to_json() + "\n").encode())
    except BaseException:
        target.abort()
        raise
    target.commit()
