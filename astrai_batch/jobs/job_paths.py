"""Where a job reads and writes (the input, the output, the stats file and the checkpoint beside
the output), and the refusals of an output before anything is touched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import stats_location
from astrai_batch.jobs.output.checkpoint import checkpoint_dir_for, peek_run_id
from astrai_batch.jobs.output.output_guard import check_existing_output


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


def check_output_path(paths: JobPaths, *, directory: bool) -> None:
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


def check_existing_output_at(paths: JobPaths, config: JobConfig) -> str | None:
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
