"""Which files an INPUT names, and in which format: one file, a directory of Parquet files,
a glob, a `datasets` directory (`datasets_dirs`) or a hub dataset's directory
(`hub_datasets`). Every problem is an `InputError` raised before any row is read."""

from __future__ import annotations

import pyarrow.fs as pafs

from astrai_batch.errors import InputError
from astrai_batch.io.datasets_dirs import datasets_files
from astrai_batch.io.filesystems import Location
from astrai_batch.io.globs import glob_files, has_glob
from astrai_batch.io.hub_datasets import is_hub_uri, split_files
from astrai_batch.io.parquet_input import parquet_files

_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "jsonl", ".jsonl.gz": "jsonl"}


def format_of_name(name: str) -> str | None:
    """'parquet', 'arrow' or 'jsonl' by a file's name; None for any other name."""
    lowered = name.lower()
    for suffix, found in sorted(_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if lowered.endswith(suffix):
            return found
    return None


def input_files(path: Location, input_format: str | None) -> tuple[str, list[Location]]:
    """(format, files in reading order) of the INPUT at `path`; `input_format` as the user
    named it (None: by the names and layout)."""
    if has_glob(path.path) and not path.exists(InputError):
        return _globbed(path, input_format)
    if not path.exists(InputError):
        raise InputError(f"input not found: {path.shown}")
    if not path.is_dir(InputError):
        return input_format or _format_of_file(path), [path]
    if input_format == "jsonl":
        return "jsonl", [path]  # the JSONL reader refuses a directory in its own words
    if input_format is None:
        found = datasets_files(path)
        if found is not None:
            return "arrow", found
        if is_hub_uri(path.shown):
            return "parquet", split_files(path, _parquet_tree(path))
    return "parquet", parquet_files(path)


def _format_of_file(path: Location) -> str:
    found = format_of_name(path.name)
    if found is None:
        raise InputError(
            f"cannot tell the input format of {path.name}: name it .parquet, .jsonl, "
            ".jsonl.gz or .arrow, or pass --input-format parquet|jsonl"
        )
    return found


def _globbed(pattern: Location, input_format: str | None) -> tuple[str, list[Location]]:
    files = glob_files(pattern)
    if not files:
        raise InputError(f"no files match {pattern.shown}")
    formats = {input_format or format_of_name(file.name) for file in files}
    if None in formats or len(formats) > 1:
        names = ", ".join(sorted({file.name.split(".", 1)[-1] for file in files}))
        raise InputError(
            f"{pattern.shown} matches files of several or unknown formats ({names}): make the "
            "glob match only .parquet files, only .arrow files, or one .jsonl file"
        )
    (chosen,) = formats
    if chosen == "jsonl" and len(files) > 1:
        raise InputError(
            f"{pattern.shown} matches {len(files)} JSONL files; a JSONL input is one file "
            "(a glob may match several Parquet or Arrow files)"
        )
    return str(chosen), files


def _parquet_tree(directory: Location) -> list[Location]:
    """The Parquet files at any depth under `directory`, in path order (hidden ones left out:
    a local copy's .cache)."""
    selector = pafs.FileSelector(directory.path, recursive=True)
    try:
        entries = directory.fs.get_file_info(selector)
    except OSError as exc:
        raise InputError(f"cannot list {directory.shown}: {exc}") from exc
    prefix = directory.path.rstrip("/") + "/"
    relative = sorted(
        entry.path[len(prefix) :]
        for entry in entries
        if entry.type == pafs.FileType.File
        and entry.path.endswith(".parquet")
        and entry.path.startswith(prefix)
        and not any(part.startswith((".", "_")) for part in entry.path[len(prefix) :].split("/"))
    )
    return [directory.child(name) for name in relative]
