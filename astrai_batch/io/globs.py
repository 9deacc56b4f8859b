"""Glob patterns in an input path (``data/train-*.parquet``, ``hf://datasets/o/n/**/*.parquet``),
on any filesystem a `Location` reaches.

The rules are those of Python's `glob`, DuckDB and Polars: ``*`` and ``?`` match within one
path component, ``[...]`` a character class, ``**`` as a whole component any number of
components; a wildcard never matches a leading dot (hidden files stay hidden). Matches are
read in path order, so a sharded split (``train-00000-of-00003`` ...) keeps its row order.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.fs as pafs

from astrai_batch.errors import AstraiBatchError, InputError
from astrai_batch.io.filesystems import Location

GLOB_CHARACTERS = "*?["


def has_glob(path: str) -> bool:
    return any(character in path for character in GLOB_CHARACTERS)


def glob_files(pattern: Location, error: type[AstraiBatchError] = InputError) -> list[Location]:
    """The files `pattern` matches, in path order (none when nothing matches)."""
    parts = pattern.path.split("/")
    first = next(number for number, part in enumerate(parts) if has_glob(part))
    base_path = "/".join(parts[:first]) or "/"
    tail = "/".join(parts[first:])
    shown = pattern.shown[: len(pattern.shown) - len(tail)].rstrip("/")
    base = Location(pattern.fs, base_path, shown)
    matcher = compile_glob(tail)
    selector = pafs.FileSelector(base_path, recursive="/" in tail, allow_not_found=True)
    try:
        entries = pattern.fs.get_file_info(selector)
    except (OSError, pa.ArrowException) as exc:
        raise error(f"cannot list {base.shown or '/'}: {exc}") from exc
    prefix = base_path.rstrip("/") + "/"
    found = sorted(
        relative
        for entry in entries
        if entry.type == pafs.FileType.File
        and entry.path.startswith(prefix)
        and matcher.fullmatch(relative := entry.path[len(prefix) :])
    )
    return [base.child(relative) for relative in found]


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regular expression matching the relative paths `pattern` matches."""
    pieces = []
    components = pattern.split("/")
    for number, component in enumerate(components):
        last = number == len(components) - 1
        if component == "**":
            # Any number of whole components, none hidden; as the last component, any file.
            pieces.append(r"(?:[^/.][^/]*/)*" + (r"[^/.][^/]*" if last else ""))
            continue
        pieces.append(_component(component) + ("" if last else "/"))
    return re.compile("".join(pieces))


def _component(component: str) -> str:
    out = [r"(?!\.)"] if component[:1] in ("*", "?", "[") else []
    index = 0
    while index < len(component):
        character = component[index]
        if character == "*":
            out.append(r"[^/]*")
        elif character == "?":
            out.append(r"[^/]")
        elif character == "[" and (end := component.find("]", index + 2)) > 0:
            inner = component[index + 1 : end]
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            out.append("[" + inner.replace("\\", r"\\") + "]")
            index = end
        else:
            out.append(re.escape(character))
        index += 1
    return "".join(out)
