"""What a run finds at its OUTPUT before it starts, and what it may do about it.

Checked before the model loads, holding the output's run lock; nothing here deletes
anything but our own leftovers. An existing output (or stats file) is refused with one line
unless `--overwrite` is given or it carries the run id of the checkpoint beside it (that
job finished and was killed before removing its checkpoint; OpenAI lines, which carry no
run id, by the stats file committed just before them). A ``parquet-dir`` output also
follows `dir_ownership`: files we cannot prove we wrote are never replaced.
"""

from __future__ import annotations

from astrai_batch.errors import OutputError
from astrai_batch.io.filesystems import Location
from astrai_batch.jobs.output.assembly import output_run_id, remove_stale_temp_files
from astrai_batch.jobs.output.dir_ownership import (
    index_run_id,
    read_index,
    refuse_replacing,
    remove_owned_dir,
    restore_displaced,
    staging_location,
)


def check_existing_output(
    output: Location,
    stats: Location,
    *,
    output_format: str,
    overwrite: bool,
    run_id: str | None,
) -> str | None:
    """Refuse what may not be replaced (`OutputError`); remove temporary files of killed
    writers. Returns `run_id` when the output there is that checkpoint's finished work."""
    remove_stale_temp_files(stats)
    if output_format == "parquet-dir":
        if run_id is not None:
            restore_displaced(output, run_id)
            if output.is_local:
                remove_owned_dir(staging_location(output, run_id), run_id)
            if output.is_dir() and index_run_id(read_index(output)) == run_id:
                return run_id
        refuse_replacing(output, overwrite=overwrite, run_id=run_id)
    else:
        remove_stale_temp_files(output)
        if output.exists():
            # OpenAI lines carry no run id: the stats file committed just before them does.
            owner = output if output_format != "openai-jsonl" else stats
            if run_id is not None and output_run_id(owner) == run_id:
                return run_id
            if not overwrite:
                raise _exists(output)
    if stats.exists() and not overwrite and (run_id is None or output_run_id(stats) != run_id):
        raise _exists(stats)
    return None


def _exists(target: Location) -> OutputError:
    return OutputError(f"output {target.shown} already exists; pass --overwrite to replace it")
