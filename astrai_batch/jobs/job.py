"""A job end to end: check the paths, open the input, load the model, resume or start a
checkpoint, run the remaining windows, then write the stats and the output and drop the
checkpoint.

Everything that can be refused is refused before the model loads (missing input, existing
output, unusable columns), and nothing is left behind by a refusal. The output appears only
complete; a crashed or interrupted job leaves only its checkpoint, which the same command
resumes. INPUT and OUTPUT are local paths or URIs (`io.filesystems`); the stats file and the
checkpoint live beside the output, on its filesystem.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import anyio
import pyarrow as pa

from astrai_batch.engine import keep_freed_memory, load_model, set_cpu_threads
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.model.support import require_chat_template
from astrai_batch.engine.threads import describe_threads
from astrai_batch.errors import AstraiBatchError, ConfigError, JobAbortedError, OutputError
from astrai_batch.io import open_input
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.jobs.executors.local_execution import ExecutionResult, JobExecution
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import (
    output_metadata,
    output_run_id,
    remove_stale_temp_files,
    stats_location,
    window_tables,
    write_openai_output,
    write_parquet_output,
    write_stats,
)
from astrai_batch.jobs.output.checkpoint import Checkpoint, checkpoint_dir_for, peek_run_id
from astrai_batch.jobs.output.identity import job_identity
from astrai_batch.jobs.output.output_lock import OutputLock, lock_for
from astrai_batch.jobs.output.parquet_dir import check_output_location, write_parquet_dir
from astrai_batch.jobs.output.records import output_schema, part_schema
from astrai_batch.jobs.progress import Progress, make_progress
from astrai_batch.jobs.signals import interrupt_exit_code
from astrai_batch.jobs.summary import JobSummary

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

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
) -> JobSummary:
    """Run (or resume) a job. Returns its summary; raises `AstraiBatchError` when the job
    cannot start or fails (a `--max-errors` abort is a summary with status 'aborted')."""
    started = time.monotonic()
    paths = JobPaths.for_output(input_path, output_path)
    _check_output_path(paths, directory=config.output_format == "parquet-dir")
    # Before anything is touched: a second run on this output must change nothing.
    lock = lock_for(paths.checkpoint, paths.output.shown)
    lock.acquire()
    try:
        progress = make_progress(
            stderr or sys.stderr, quiet=config.quiet, interval=config.progress_seconds
        )
        try:
            with ExitStack() as model_cleanup:
                return _run(config, paths, progress, started, lock, model_cleanup)
        finally:
            progress.close()
    finally:
        lock.release()


def _run(
    config: JobConfig,
    paths: JobPaths,
    progress: Progress,
    started: float,
    lock: OutputLock,
    model_cleanup: ExitStack,
) -> JobSummary:
    attention = config.resolved_attention_backend()  # a bad choice fails before anything loads
    already_written = _check_output(paths, config)
    source = open_input(
        paths.input,
        input_format=config.input_format,
        prompt_column=config.prompt_column,
        id_column=config.id_column,
        keep_columns=config.keep_columns,
    )
    kept = source.kept_schema()
    schema = part_schema(kept)
    final_schema = output_schema(
        kept, save_tokens=config.save_tokens, logprobs=config.sampling.logprobs
    )
    total_rows = source.count_rows()
    progress.message(f"{total_rows} rows ({source.shape}) in {paths.input.shown}")
    threads = set_cpu_threads(config.threads)
    keep_freed_memory()
    progress.message(f"loading model {config.model} ({describe_threads(threads)})")
    loaded = load_model(config.model, **config.model_options())
    model_cleanup.callback(loaded.close)  # tensor-parallel ranks end with the job
    if config.max_model_len is not None and config.max_model_len > loaded.max_model_len:
        raise ConfigError(
            f"--max-model-len {config.max_model_len} exceeds the context of model "
            f"{loaded.name!r} ({loaded.max_model_len} tokens)"
        )
    if source.shape == "messages":
        require_chat_template(loaded)
    input_fingerprint = source.fingerprint()
    identity = job_identity(config, input_fingerprint, loaded)
    checkpoint = Checkpoint.open(
        paths.checkpoint, identity, planning=config.planning_options(), restart=config.restart
    )
    if checkpoint.planning != config.planning_options():
        progress.message(f"planning as the checkpoint's job did: {checkpoint.planning.describe()}")

    resumed_rows = checkpoint.total_stats().input_rows
    report = _Report(
        config, paths, loaded.name, total_rows, resumed_rows, started, checkpoint, attention
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
    execution = JobExecution(
        config=config,
        loaded=loaded,
        source=source,
        checkpoint=checkpoint,
        schema=schema,
        total_rows=total_rows,
        progress=progress,
    )
    try:
        run = _run_async(execution)
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
    progress.close()
    progress.message(f"writing {paths.output.shown}")
    metadata = output_metadata(
        config=config.to_dict(),
        model={**identity["model"], "architecture": loaded.architecture},
        input_fingerprint=input_fingerprint,
        run_id=checkpoint.run_id,
    )
    lock.verify()
    _write_outputs(config, paths, checkpoint, final_schema, metadata, loaded)
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
        )

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
    """Refuse an existing output (without --overwrite) and remove temporary files a killed
    run left. Returns the run id of an existing output that the checkpoint beside it produced
    (its job finished but was killed before cleaning up)."""
    output = paths.output
    if config.output_format == "parquet-dir":
        check_output_location(output, config.output_format, config.overwrite)
        return None
    for target in (output, paths.stats):
        remove_stale_temp_files(target)
    if not output.exists() or config.overwrite:
        return None
    run_id = None if config.restart else peek_run_id(paths.checkpoint)
    if run_id is not None and output_run_id(output) == run_id:
        return run_id
    raise OutputError(f"output {output.shown} already exists; pass --overwrite to replace it")


def _write_outputs(
    config: JobConfig,
    paths: JobPaths,
    checkpoint: Checkpoint,
    final_schema: pa.Schema,
    metadata: dict[str, str],
    loaded: LoadedModel,
) -> None:
    write_stats(checkpoint, paths.stats, metadata)
    if config.output_format == "parquet":
        write_parquet_output(
            checkpoint, paths.output, final_schema, metadata, overwrite=config.overwrite
        )
    elif config.output_format == "parquet-dir":
        tables = window_tables(checkpoint, final_schema.names)
        write_parquet_dir(paths.output, tables, final_schema, metadata, config.overwrite)
    else:
        write_openai_output(
            checkpoint,
            paths.output,
            model_name=loaded.name,
            tokenizer=loaded.tokenizer,
            overwrite=config.overwrite,
        )


def _run_async(execution: JobExecution) -> ExecutionResult:
    try:
        return anyio.run(execution.run)
    except BaseExceptionGroup as group:
        raise _single(group) from None


def _single(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (task groups wrap them)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
