"""Which files of a ``parquet-dir`` output a run may replace or delete: only those it can
prove this code wrote.

A file is ours when the directory's own ``_index.json`` names it (or is that index), when
its name carries the run id of the checkpoint beside the output (``part-{run_id}-...``, an
object-store part of a killed attempt of this same job), or when it is one of our writers'
temporary files of such a name (``.{name}.tmp-...``). Anything else (a pyarrow or Spark
dataset, a note, a sub-directory) is the user's: a run refuses that output, with or without
``--overwrite``, rather than delete it. The local staging directory ``.{name}.tmp-{run_id}``
carries the run id in its own name, so the parts inside it are ours as well.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pyarrow.fs as pafs

from astrai_batch.errors import OutputError
from astrai_batch.jobs.output.assembly import RUN_ID_KEY

INDEX_NAME = "_index.json"
_LOCAL_PART = re.compile(r"part-\d{5}\.parquet")
_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-[0-9a-f-]+")
_SHOWN_FOREIGN = 3

__all__ = ["INDEX_NAME", "RUN_ID_KEY"]


def staging_location(output: Any, run_id: str) -> Any:
    """Where a local run builds the new directory before swapping it in."""
    return output.sibling(f".{output.name}.tmp-{run_id}")


def old_location(output: Any, run_id: str) -> Any:
    """Where the old directory waits when the kernel cannot swap in one step."""
    return output.sibling(f".{output.name}.old-{run_id}")


def read_index(directory: Any) -> dict[str, Any] | None:
    """The directory's ``_index.json`` when it is one of ours, else None."""
    try:
        value = json.loads(directory.child(INDEX_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("parts"), list):
        return None
    return value


def index_run_id(index: dict[str, Any] | None) -> str | None:
    metadata = (index or {}).get("metadata")
    value = metadata.get(RUN_ID_KEY) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None


def owned_names(
    names: list[str], index: dict[str, Any] | None, run_id: str | None, *, staging: bool
) -> tuple[list[str], list[str]]:
    """`names` split into (ours, not ours) by the rules above."""
    indexed = {INDEX_NAME}
    for entry in (index or {}).get("parts", []):
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            indexed.add(entry["file"])

    def ours(name: str) -> bool:
        if name in indexed or (run_id and name.startswith(f"part-{run_id}-")):
            return True
        if staging and _LOCAL_PART.fullmatch(name):
            return True
        temp = _TEMP.fullmatch(name)
        return temp is not None and ours(temp.group("name"))

    mine = [name for name in names if ours(name)]
    return mine, [name for name in names if name not in mine]


def refuse_replacing(output: Any, *, overwrite: bool, run_id: str | None) -> None:
    """Raise `OutputError` unless a parquet-dir run may write `output`: it does not exist, is
    an empty directory, holds only a killed attempt's files of `run_id`, or (`overwrite`) is
    one of our outputs (or a local file). Touches nothing."""
    info = output.info()
    exists = f"output {output.shown} already exists; pass --overwrite to replace it"
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        if not overwrite:
            raise OutputError(exists)
        if not output.is_local:
            raise OutputError(
                f"output {output.shown} is an object; a parquet-dir output needs a prefix "
                "of its own"
            )
        return
    names = output.list_names()
    index = read_index(output)
    _, foreign = owned_names(names, index, run_id, staging=False)
    if foreign:
        shown = ", ".join(foreign[:_SHOWN_FOREIGN]) + (", ..." if len(foreign) > 3 else "")
        raise OutputError(
            f"output {output.shown} holds files astrai-batch did not write ({shown}); "
            "move them away or choose another output"
        )
    if index is not None and not overwrite and index_run_id(index) != run_id:
        raise OutputError(exists)


def remove_owned_dir(directory: Any, run_id: str) -> None:
    """Delete what of `directory` (a staging or swapped-out directory of this run, or a
    swapped-out file) is ours; the directory itself only once it is empty."""
    info = directory.info()
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        directory.delete()  # a single file OUTPUT that --overwrite replaced
        return
    files = [entry.name for entry in directory.files()]
    mine, _ = owned_names(files, read_index(directory), run_id, staging=True)
    for name in sorted(mine, key=lambda name: name == INDEX_NAME):  # the index last
        directory.child(name).delete()
    if not directory.list_names():
        directory.delete()


def restore_displaced(output: Any, run_id: str) -> None:
    """Put back an old local output that a run killed between its two renames left aside
    (only where the kernel could not swap in one step)."""
    if not output.is_local:
        return
    old = old_location(output, run_id)
    if old.exists() and not output.exists():
        os.rename(old.local_path, output.local_path)
