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

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from astrai_batch.engine.model.spec import resolve_model_spec
from astrai_batch.errors import AstraiBatchError, JobAbortedError
from astrai_batch.io import open_input
from astrai_batch.jobs.crash_points import crash_point
from astrai_batch.jobs.executors.base import ExecutionResult, Executor
from astrai_batch.jobs.job_adapters import adapter_identity, read_job_adapters, with_lora_column
from astrai_batch.jobs.job_commit import write_outputs
from astrai_batch.jobs.job_paths import JobPaths, check_existing_output_at, check_output_path
from astrai_batch.jobs.job_report import EXIT_FAILED, JobReport
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import output_metadata
from astrai_batch.jobs.output.checkpoint_opening import open_checkpoint
from astrai_batch.jobs.output.output_lock import OutputLock, lock_for
from astrai_batch.jobs.output.records import output_schema, part_schema
from astrai_batch.jobs.output.stats import WorkStats
from astrai_batch.jobs.output.task_records import fixed_size_embedding
from astrai_batch.jobs.progress import Progress, make_progress
from astrai_batch.jobs.signals import Interrupted, InterruptGuard, interrupt_exit_code
from astrai_batch.jobs.summary import JobSummary


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
    named_dir = str(output_path).split("?", 1)[0].endswith(("/", os.sep))
    config = config.for_output(paths.output.name, directory=named_dir or paths.output.is_dir())
    check_output_path(paths, directory=config.output_format == "parquet-dir")
    chosen = executor if executor is not None else executor_for(config)
    # Before anything is touched: a second run on this output must change nothing.
    lock = lock_for(paths.checkpoint, paths.output.shown)
    lock.acquire()
    known = _Known()
    try:
        progress = make_progress(
            stderr or sys.stderr, quiet=config.quiet, interval=config.progress_seconds
        )
        try:
            with InterruptGuard() as guard:
                try:
                    try:
                        return _run(config, paths, progress, started, lock, chosen, guard, known)
                    finally:
                        chosen.close()  # tensor-parallel ranks end with the job
                except Interrupted as stop:
                    progress.close()
                    return _interrupted(config, paths, started, known, stop.signum)
        finally:
            progress.close()
    finally:
        lock.release()


@dataclass
class _Known:
    """What the job knows so far, for the summary of an interrupted run."""

    total_rows: int = 0
    attention_backend: str | None = None
    report: JobReport | None = None


def _interrupted(
    config: JobConfig,
    paths: JobPaths,
    started: float,
    known: _Known,
    signum: int,
    run: ExecutionResult | None = None,
) -> JobSummary:
    """The summary of a run that SIGINT or SIGTERM stopped. A checkpoint holding finished rows
    stays for the rerun to resume; one holding none is removed, so nothing is left to block
    a rerun with other options."""
    name = signal.Signals(signum).name
    code = interrupt_exit_code(signum)
    report = known.report
    if report is not None and report.checkpoint.has_finished_rows():
        message = (
            f"interrupted by {name}; finished rows are saved in {paths.checkpoint.shown}, "
            "rerun the same command to resume"
        )
        return report.summary("interrupted", code, run, message)
    message = f"interrupted by {name} before any row finished; nothing was saved"
    if report is not None:
        summary = report.summary("interrupted", code, run, message)
        report.checkpoint.remove()
        return summary
    return JobSummary(
        status="interrupted",
        exit_code=code,
        input=paths.input.shown,
        output=None,
        stats_output=None,
        output_format=config.output_format or "",
        model=config.model,
        total_rows=known.total_rows,
        totals=WorkStats(),
        resumed_rows=0,
        run_decode_tokens=0,
        run_wall_seconds=time.monotonic() - started,
        message=message,
        attention_backend=known.attention_backend,
        device=config.device,
        dtype=config.dtype,
    )


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
    guard: InterruptGuard,
    known: _Known,
) -> JobSummary:
    attention = config.resolved_attention_backend()  # a bad choice fails before anything loads
    known.attention_backend = attention
    already_written = check_existing_output_at(paths, config)
    # a mistyped model fails here, in one line, before the input is read
    resolve_model_spec(config.model, config.revision)
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
        # OpenAI chat lines may carry tools; the parser's split has its own column
        tool_calls=config.task == "generate" and source.shape in ("openai", "mixed"),
        reasoning=config.reasoning_parser is not None,
        embeddings=source.shape in ("openai", "mixed"),
    )
    total_rows = source.count_rows()
    known.total_rows = total_rows
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
        on_restart=progress.message,
    )
    if checkpoint.planning != config.planning_options():
        progress.message(f"planning as the checkpoint's job did: {checkpoint.planning.describe()}")

    resumed_rows = checkpoint.total_stats().input_rows
    report = JobReport(
        config,
        paths,
        model.name,
        total_rows,
        resumed_rows,
        started,
        checkpoint,
        attention,
        threads=model.threads,
    )
    known.report = report
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
    finally:
        guard.install()  # the executor's event loop left the default handlers behind
    if run.signum is not None:
        progress.close()
        return _interrupted(config, paths, started, known, run.signum, run)
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
        size = config.dimensions or model.embedding_size or model.hidden_size
        final_schema = fixed_size_embedding(final_schema, size)
    write_outputs(
        config, paths.output, paths.stats, checkpoint, final_schema, metadata, model, total_rows
    )
    summary = report.completed(run)  # reads the checkpoint: before it is removed
    checkpoint.remove()
    crash_point("checkpoint_removed")
    return summary
