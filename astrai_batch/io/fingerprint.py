"""Content identities of files, so a resumed job can tell it reads the same data.

An identity is made of content only, never of a path or an mtime: the same bytes downloaded
again to a new path are the same input. Each entry still records the path it was read from,
for messages; comparisons leave it out (`same_content`).

- A JSONL file (plain or gzip) is hashed whole, streamed in chunks (one more sequential read
  of a file the job reads anyway; memory stays bounded).
- A Parquet file is identified by its size and one digest of its footer (the schema, the row
  groups, every column chunk's offsets and statistics) and its first and last MiB of data
  pages. A rewritten file differs in its footer; a byte changed in the middle of a file of
  more than 2 MiB that keeps the size and every statistic goes unseen (hashing many-GB
  inputs whole on every start would cost minutes).
- An Arrow IPC file (a `datasets` directory's) is sampled the same way: its size and first
  and last MiB (it has no footer to hash in the stream format `datasets` writes).
- A model directory is identified by the files that define its results (config, tokenizer,
  weights; not its README), each by name, size and the same head-and-tail digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from astrai_batch.errors import InputError

if TYPE_CHECKING:
    from astrai_batch.io.filesystems import Location

SAMPLE_BYTES = 1 << 20
_CHUNK_BYTES = 1 << 20
_PARQUET_TAIL = 8  # footer length (4 bytes, little endian) + the magic "PAR1"
# Files of a model directory that cannot change a result: documentation and licences.
_MODEL_DOC_SUFFIXES = (".md", ".txt.license")
_MODEL_DOC_NAMES = ("license", "notice", "use_policy")


def file_fingerprint(path: Path | Location) -> dict[str, Any]:
    """{path, size, sha256} of a whole file, streamed."""
    digest = hashlib.sha256()
    with _opened(path) as (handle, size):
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return {"path": _named(path), "size": size, "sha256": digest.hexdigest()}


def sampled_fingerprint(path: Path | Location) -> dict[str, Any]:
    """{path, size, sample_sha256}: a digest of the file's first and last MiB, and, for a
    Parquet file, of its whole footer (which may be larger than a MiB)."""
    digest = hashlib.sha256()
    with _opened(path) as (handle, size):
        digest.update(handle.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            # Starting no earlier than the head's end: a file under 2 MiB is hashed whole.
            handle.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(handle.read(SAMPLE_BYTES))
        footer = _parquet_footer_range(handle, size)
        if footer is not None:
            start, length = footer
            handle.seek(start)
            digest.update(b"footer")
            digest.update(handle.read(length))
    return {"path": _named(path), "size": size, "sample_sha256": digest.hexdigest()}


def files_fingerprint(input_format: str, paths: list[Path] | list[Location]) -> dict[str, Any]:
    """The fingerprint of a whole input: its format and every file, in reading order."""
    identify = sampled_fingerprint if input_format in ("parquet", "arrow") else file_fingerprint
    return {"format": input_format, "files": [identify(path) for path in paths]}


def directory_fingerprint(directory: Path) -> str:
    """One digest of the files of a model directory that can change results (sampled like a
    Parquet file: name, size, first and last MiB)."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if not path.is_file() or not _defines_results(relative):
            continue
        entry = sampled_fingerprint(path)
        digest.update(
            f"{relative.as_posix()}\0{entry['size']}\0{entry['sample_sha256']}\n".encode()
        )
    return digest.hexdigest()


def same_content(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two file entries describe the same bytes (their paths may differ)."""
    return _without_path(saved) == _without_path(current)


def _without_path(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key != "path"}


def _defines_results(relative: Path) -> bool:
    if any(part.startswith(".") for part in relative.parts):
        return False  # .git, .cache and the like
    name = relative.name.lower()
    return not name.endswith(_MODEL_DOC_SUFFIXES) and name.split(".")[0] not in _MODEL_DOC_NAMES


def _parquet_footer_range(handle: BinaryIO, size: int) -> tuple[int, int] | None:
    """(offset, length) of a Parquet file's footer, or None when the file is not Parquet."""
    if size < 2 * _PARQUET_TAIL:
        return None
    handle.seek(size - _PARQUET_TAIL)
    tail = handle.read(_PARQUET_TAIL)
    if tail[4:] != b"PAR1":
        return None
    length = int.from_bytes(tail[:4], "little")
    start = size - _PARQUET_TAIL - length
    return (start, length) if start >= 4 else None


def _named(path: Path | Location) -> str:
    """How an entry records where it was read from (never compared, see `same_content`)."""
    if isinstance(path, Path):
        return str(path.resolve())
    return str(Path(path.path).resolve()) if path.is_local else path.shown


@contextlib.contextmanager
def _opened(path: Path | Location) -> Iterator[tuple[BinaryIO, int]]:
    """The file opened for reading (random access: a remote object is read by ranges), and
    its size; any failure an `InputError`."""
    try:
        if isinstance(path, Path):
            with path.open("rb") as handle:
                yield handle, os.fstat(handle.fileno()).st_size
        else:
            with path.fs.open_input_file(path.path) as remote:
                yield remote, remote.size()
    except OSError as exc:  # pyarrow's I/O errors are OSErrors too
        shown = path if isinstance(path, Path) else path.shown
        raise InputError(f"cannot read {shown}: {exc.strerror or exc}") from exc
