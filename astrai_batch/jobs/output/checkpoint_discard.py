"""`--restart`: discard this output's checkpoint, and only what it provably holds.

The checkpoint directory is ours, but a user (or a tool) may have put something in it; a
restart deletes only the files this checkpoint's runs wrote: its manifest, its local parts
(``part-NNNNNN.parquet``), the shard parts of its run id and our temporaries (see
`checkpoint_manifest.is_our_debris`). Anything else stays, and the restart says so, as it
says what it removed.
"""

from __future__ import annotations

from astrai_batch.errors import CheckpointError
from astrai_batch.io.filesystems import Location
from astrai_batch.jobs.output.checkpoint_manifest import (
    LOCAL_PART,
    MANIFEST_NAME,
    is_our_debris,
    read_manifest,
)
from astrai_batch.jobs.output.run_lock import LOCK_NAME
from astrai_batch.jobs.output.shard_parts import SHARD_PART


def our_files(directory: Location, names: list[str], run_id: str | None) -> list[str]:
    """The names among `names` (a checkpoint directory's) that the checkpoint of run `run_id`
    wrote (None: its manifest is unreadable, so only names of our own kinds count)."""
    ours = []
    for name in names:
        shard = SHARD_PART.match(name)
        if (
            name == MANIFEST_NAME
            or LOCAL_PART.match(name)
            or (shard is not None and run_id is not None and shard[3] == run_id)
            or is_our_debris(name, set())
        ):
            ours.append(name)
    return ours


def discard_checkpoint(directory: Location) -> str:
    """Delete this output's checkpoint files in `directory` (the caller holds the run lock);
    returns a sentence saying what was removed and what was kept."""
    names = [name for name in directory.list_names() if name != LOCK_NAME]
    if not names:
        return f"--restart: no checkpoint in {directory.shown}, nothing to remove"
    rows, run_id = None, None
    try:
        from astrai_batch.jobs.output.checkpoint import Checkpoint

        checkpoint = Checkpoint(directory, read_manifest(directory.child(MANIFEST_NAME)))
        run_id = checkpoint.run_id
        rows = checkpoint.total_stats().input_rows
    except (CheckpointError, OSError):
        pass  # no manifest or a damaged one: only the names of our kinds count
    removed = our_files(directory, names, run_id)
    for name in (*[n for n in removed if n != MANIFEST_NAME], MANIFEST_NAME):
        if name in removed:
            directory.child(name).delete()
    parts = sum(1 for name in removed if LOCAL_PART.match(name) or SHARD_PART.match(name))
    what = f"{parts} part{'' if parts == 1 else 's'}"
    if rows is not None:
        what += f" holding {rows} finished row{'' if rows == 1 else 's'}"
    text = f"--restart: removed the checkpoint in {directory.shown} ({what})"
    kept = sorted(set(names) - set(removed))
    if kept:
        text += f"; kept {', '.join(kept)}, which this checkpoint did not write"
    return text
