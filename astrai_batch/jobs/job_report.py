"""A job's summary and exit code, from what is known once its checkpoint is open: 0; 3 when
some rows failed and --fail-on-row-errors is given; 1 when the job was aborted or every row
failed (a job that produced nothing is no success)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from astrai_batch.jobs.executors.base import ExecutionResult
from astrai_batch.jobs.job_paths import JobPaths
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import checkpoint_adapter_counts
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.summary import JobSummary

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ROW_ERRORS = 3


@dataclass(frozen=True)
class JobReport:
    """Builds the job's summary from what is known once the checkpoint is open."""

    config: JobConfig
    paths: JobPaths
    model_name: str
    total_rows: int
    resumed_rows: int
    started: float
    checkpoint: Checkpoint
    attention_backend: str
    threads: int | None = None

    def summary(
        self, status: str, exit_code: int, run: ExecutionResult | None, message: str | None = None
    ) -> JobSummary:
        written = status.startswith("completed") or status == "failed"
        return JobSummary(
            status=status,
            exit_code=exit_code,
            input=self.paths.input.shown,
            output=self.paths.output.shown if written else None,
            stats_output=self.paths.stats.shown if written else None,
            output_format=self.config.output_format,
            model=self.model_name,
            total_rows=self.total_rows,
            totals=self.checkpoint.total_stats(),
            resumed_rows=self.resumed_rows,
            run_decode_tokens=run.run_stats.decode_tokens if run else 0,
            run_wall_seconds=time.monotonic() - self.started,
            message=message,
            run_generation_seconds=run.wall_seconds if run else 0.0,
            threads=self.threads,
            attention_backend=self.attention_backend,
            device=self.config.device,
            dtype=self.config.dtype,
            dtype_choice=getattr(self.config, "dtype_choice", None),
            lora=self._adapter_counts(),
        )

    def _adapter_counts(self) -> list[dict] | None:
        if not self.config.lora:
            return None
        names = [name for name, _ in self.config.lora]
        return checkpoint_adapter_counts(self.checkpoint, names)

    def completed(self, run: ExecutionResult | None) -> JobSummary:
        """Exit 0, or 3 with --fail-on-row-errors when some rows failed, or 1 (status
        'failed') when every row failed: a job that produced nothing is not a success."""
        failed = self.checkpoint.total_stats().failed_rows
        if failed == 0:
            return self.summary("completed", EXIT_OK, run)
        if failed == self.total_rows:
            index, error = self.checkpoint.first_error() or (0, "")
            return self.summary(
                "failed",
                EXIT_FAILED,
                run,
                f"all {failed} rows failed; first error (row {index}): {error}",
            )
        code = EXIT_ROW_ERRORS if self.config.fail_on_row_errors else EXIT_OK
        return self.summary(
            "completed_with_errors", code, run, f"{failed} of {self.total_rows} rows failed"
        )
