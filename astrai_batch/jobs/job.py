"""A job end to end, whatever executes it: check the paths, open the input, prepare the
executor (the model), open or resume the checkpoint, let the executor run the rows the
checkpoint lacks, then write the stats and the output and drop the checkpoint.

This module owns what a job is; the executors (`executors.local_executor`,
`executors.ray_job`) only turn planned rows into committed checkpoint parts. Everything
that can be refused is refused before the model loads (missing input, existing output,
unusable columns), and nothing is left behind by a refusal. The output appears only
complete; a crashed or interrupted job leaves only its checkpoint, which the same command
resumes. INPUT and OUTPUT are local paths or URIs (`io.filesystems`); the stats file and the
checkpoint live beside the output, on its filesystem.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from astrai_batch.errors import AstraiBatchError, JobAbortedError, OutputError
from astrai_batch.io import open_input
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.jobs.executors.base import ExecutionResult, Executor
from astrai_batch.jobs.job_adapters import adapter_identity, read_job_adapters, with_lora_column
from astrai_batch.jobs.job_commit import write_outputs
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import (
    checkpoint_adapter_counts,
    output_metadata,
    stats_location,
)
from astrai_batch.jobs.output.checkpoint import Checkpoint, checkpoint_dir_for, peek_run_id
from astrai_batch.jobs.output.checkpoint_opening import open_checkpoint
from astrai_batch.jobs.output.output_guard import check_existing_output
from astrai_batch.jobs.output.output_lock import OutputLock, lock_for
from astrai_batch.jobs.output.records import output_schema, part_schema
from astrai_batch.jobs.output.task_records import fixed_size_embedding
from astrai_batch.jobs.progress import Progress, make_progress
from astrai_batch.jobs.signals import interrupt_exit_code
from astrai_batch.jobs.summary import JobSummary

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ROW_ERRORS = 3


@dataclass(frozen=True)
class JobPaths:
    """Where a job reads and writes, each a `Location` (a local path or a URI)."""

    input: Location
    output: Location
    stats: Location
    checkpoint: Location

    @classmethod
    def for_output(cls, input_path: str | Path, output_path: str | Path) -> JobPaths:
        output = resolve(output_path, OutputError)
        checkpoint = checkpoint_dir_for(output)
        return cls(resolve(input_path), output, stats_location(output), checkpoint)


def run_job(
    config: JobConfig,
    input_path: str | Path,
    output_path: str | Path,
    *,
    stderr: TextIO | None = None,
    executor: Executor | None = None,
) -> JobSummary:
    """Run (or resume) a job with `executor` (by default the one `config` names). Returns
    its summary; raises `AstraiBatchError` when the job cannot start or fails (a
    `--max-errors` abort is a summary with status 'aborted')."""
    started = time.monotonic()
    paths = JobPaths.for_output(input_path, output_path)
    _check_output_path(paths, directory=config.output_format == "parquet-dir")
    chosen = executor if executor is not None else executor_for(config)
    # Before anything is touched: a second run on this output must change nothing.
    lock = lock_for(paths.checkpoint, paths.output.shown)
    lock.acquire()
    try:
        progress = make_progress(
            stderr or sys.stderr, quiet=config.quiet, interval=config.progress_seconds
        )
        try:
            try:
                return _run(config, paths, progress, started, lock, chosen)
            finally:
                chosen.close()  # tensor-parallel ranks end with the job
        finally:
            progress.close()
    finally:
        lock.release()


def executor_for(config: JobConfig) -> Executor:
    """The executor `config` names."""
    if config.executor == "ray":
        from astrai_batch.jobs.executors.ray_job import RayExecutor, require_ray

        require_ray()  # before anything is touched
        return RayExecutor(config)
    from astrai_batch.jobs.executors.local_executor import LocalExecutor

    return LocalExecutor(config)


def _run(
    config: JobConfig,
    paths: JobPaths,
    progress: Progress,
    started: float,
    lock: OutputLock,
    executor: Executor,
) -> JobSummary:
    attention = config.resolved_attention_backend()  # a bad choice fails before anything loads
    already_written = _check_output(paths, config)
    source = open_input(paths.input, **config.input_options())
    kept = with_lora_column(source.kept_schema(), config)
    schema = part_schema(kept, config.task)
    final_schema = output_schema(
        kept,
        save_tokens=config.save_tokens,
        logprobs=config.sampling.logprobs,
        task=config.task,
        top_logprobs=config.sampling.top_logprobs > 0,
        prompt_logprobs=config.sampling.prompt_logprobs is not None,
    )
    total_rows = source.count_rows()
    progress.message(f"{total_rows} rows ({source.shape}) in {paths.input.shown}")
    adapters = read_job_adapters(config)  # a bad adapter is refused before the model loads
    model = executor.prepare(source, progress, adapters)
    input_fingerprint = source.fingerprint()
    identity = {
        "input": dict(input_fingerprint),
        "model": model.identity,
        "options": config.result_options(),
    }
    if adapters:  # a job without adapters keeps the identity it always had
        identity["adapters"] = adapter_identity(adapters)
    checkpoint = open_checkpoint(
        paths.checkpoint,
        identity,
        planning=config.planning_options(),
        restart=config.restart,
        executor=executor.mark(),
        output_written=already_written is not None,
    )
    if checkpoint.planning != config.planning_options():
        progress.message(f"planning as the checkpoint's job did: {checkpoint.planning.describe()}")

    resumed_rows = checkpoint.total_stats().input_rows
    report = _Report(
        config, paths, model.name, total_rows, resumed_rows, started, checkpoint, attention
    )
    if already_written and checkpoint.run_id == already_written:
        # A previous run wrote the output and died before removing its checkpoint.
        summary = report.completed(None)
        checkpoint.remove()
        return summary
    if resumed_rows:
        progress.message(
            f"resuming from {paths.checkpoint.shown}: {resumed_rows} of {total_rows} rows are done"
        )
    try:
        run = executor.execute(checkpoint, source, schema, total_rows, progress)
    except JobAbortedError as exc:
        return report.summary("aborted", EXIT_FAILED, None, str(exc))
    if run.signum is not None:
        progress.close()
        return report.summary(
            "interrupted",
            interrupt_exit_code(run.signum),
            run,
            f"interrupted by {signal.Signals(run.signum).name}; finished rows are saved in "
            f"{paths.checkpoint.shown}, rerun the same command to resume",
        )
    totals = checkpoint.total_stats()
    if totals.input_rows != total_rows:
        raise AstraiBatchError(
            f"the job finished with {totals.input_rows} of {total_rows} rows done; the input "
            "changed while it ran"
        )
    allowed = None if config.max_errors is None else config.max_errors.allowed(total_rows)
    if allowed is not None and totals.failed_rows > allowed:
        # An executor that cannot stop its workers early (Ray) finishes; nothing is written.
        return report.summary(
            "aborted",
            EXIT_FAILED,
            run,
            f"{totals.failed_rows} rows failed, more than --max-errors "
            f"{config.max_errors.describe() if config.max_errors else ''} allows "
            f"({allowed} of {total_rows} rows); no output written",
        )
    progress.close()
    progress.message(f"writing {paths.output.shown}")
    architecture = executor.architecture(checkpoint)
    metadata = output_metadata(
        config=config.to_dict(),
        model={**model.identity, "architecture": architecture},
        input_fingerprint=input_fingerprint,
        run_id=checkpoint.run_id,
    )
    lock.verify()
    if config.task == "embed":  # the vector's size is known once the model is
        size = config.dimensions or model.hidden_size
        final_schema = fixed_size_embedding(final_schema, size)
    write_outputs(
        config, paths.output, paths.stats, checkpoint, final_schema, metadata, model, total_rows
    )
    summary = report.completed(run)  # reads the checkpoint: before it is removed
    checkpoint.remove()
    return summary


@dataclass(frozen=True)
class _Report:
    """Builds the job's summary from what is known once the checkpoint is open."""

    config: JobConfig
    paths: JobPaths
    model_name: str
    total_rows: int
    resumed_rows: int
    started: float
    checkpoint: Checkpoint
    attention_backend: str

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
            attention_backend=self.attention_backend,
            device=self.config.device,
            dtype=self.config.dtype,
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


def _check_output_path(paths: JobPaths, *, directory: bool) -> None:
    """Refuse an output path that can never be written (checks that touch nothing); a
    `directory` output (parquet-dir) may be an existing directory."""
    output = paths.output
    # An object store has no directories to create first; a local output's must exist.
    if output.is_local and not output.parent.is_dir():
        raise OutputError(f"output directory does not exist: {output.parent.shown}")
    if output.is_dir() and not directory:
        raise OutputError(f"output {output.shown} is a directory; give a file name")
    if output.same_place(paths.input):
        raise OutputError(f"output {output.shown} is the input file")


def _check_output(paths: JobPaths, config: JobConfig) -> str | None:
    """Refuse an existing output that is not ours to replace (`output_guard`). Returns the
    run id of an existing output that the checkpoint beside it produced (its job finished
    but was killed before removing the checkpoint)."""
    return check_existing_output(
        paths.output,
        paths.stats,
        output_format=config.output_format,
        overwrite=config.overwrite,
        run_id=None if config.restart else peek_run_id(paths.checkpoint),
    )
