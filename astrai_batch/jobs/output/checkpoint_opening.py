"""Opening a job's checkpoint: resume it, hand it to another executor, refuse it, or start a
new one. What decides is the manifest beside the output: whose job it records (its identity,
`identity.job_differences`) and which executor owns its parts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from astrai_batch.errors import CheckpointError, OutputError
from astrai_batch.io.filesystems import Location, as_location
from astrai_batch.jobs.output.checkpoint import Checkpoint
from astrai_batch.jobs.output.checkpoint_discard import discard_checkpoint
from astrai_batch.jobs.output.checkpoint_manifest import (
    MANIFEST_NAME,
    RESTART_HINT,
    ExecutorMark,
    new_manifest,
    read_manifest,
)
from astrai_batch.jobs.output.identity import job_differences
from astrai_batch.jobs.planning.prefix_order import PlanningOptions

LOCAL = ExecutorMark("local")


def open_checkpoint(
    directory: Path | Location,
    job: Mapping[str, Any],
    *,
    planning: PlanningOptions,
    restart: bool,
    executor: ExecutorMark = LOCAL,
    output_written: bool = False,
    on_restart: Callable[[str], None] | None = None,
) -> Checkpoint:
    """Resume the checkpoint in `directory` if it belongs to `job` and `executor`, else
    start a new one.

    A checkpoint of a different job is refused with `CheckpointError` listing what
    changed; one holding rows another executor finished is refused naming that executor;
    `restart` discards either. A new checkpoint records `planning`; a resumed one keeps
    its own (`checkpoint.planning`), which the job then uses. `output_written`: the output
    beside it carries its run id, so only its manifest matters. `on_restart` is told what
    `restart` removed (`checkpoint_discard`). The caller holds the output's run lock.
    """
    job = json.loads(json.dumps(job))  # compare as stored: tuples are lists in JSON
    directory = as_location(directory)
    if restart:
        said = discard_checkpoint(directory)
        if on_restart is not None:
            on_restart(said)
    if directory.child(MANIFEST_NAME).exists():
        checkpoint = Checkpoint(directory, read_manifest(directory.child(MANIFEST_NAME)))
        # a refused checkpoint is left exactly as it was, its debris too: debris goes only
        # once this run takes the checkpoint over or resumes it
        if checkpoint.executor != executor:
            _take_over(checkpoint, job, planning, executor)
            return checkpoint
        differences = job_differences(checkpoint.job, job)
        if differences and not output_written and not checkpoint.has_finished_rows():
            # Nothing finished in it (a run stopped while it loaded or before its first
            # save): there is nothing to protect, so it never blocks a changed job.
            checkpoint = Checkpoint(directory, new_manifest(job, planning, executor))
            checkpoint.remove_debris()
            checkpoint.save_manifest()
            return checkpoint
        if differences:
            raise CheckpointError(
                f"the checkpoint in {directory.shown} was made by a different job "
                f"({'; '.join(differences)}); {RESTART_HINT}, or restore the original "
                "settings to resume"
            )
        checkpoint.remove_debris()
        if not output_written:  # else a kill while removing it may have taken parts
            checkpoint.require_parts()
        return checkpoint
    # No manifest: nothing was ever saved (a crash right after creating the directory).
    try:
        directory.make_dir()
    except OSError as exc:
        raise OutputError(
            f"cannot create checkpoint {directory.shown}: {exc.strerror or exc}"
        ) from exc
    checkpoint = Checkpoint(directory, new_manifest(job, planning, executor))
    checkpoint.remove_debris()
    checkpoint.save_manifest()
    return checkpoint


def _take_over(
    checkpoint: Checkpoint, job: dict[str, Any], planning: PlanningOptions, executor: ExecutorMark
) -> None:
    """Hand a checkpoint to another executor: only while it holds no finished rows (the
    executors plan rows into windows and shards differently, so one cannot continue the
    other's partial work)."""
    if checkpoint.has_finished_rows():
        raise CheckpointError(
            f"the checkpoint in {checkpoint.directory.shown} holds rows finished by "
            f"{checkpoint.executor.describe()}; rerun with {checkpoint.executor.describe()} to "
            f"resume it, or {RESTART_HINT}"
        )
    checkpoint.remove_debris()
    checkpoint.restart_as(job, planning, executor)
