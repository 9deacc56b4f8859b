"""A cheap identity for input files, so a resumed job can tell it reads the same data.

Hashing whole inputs (often many GB) on every start would cost minutes; size, mtime and a
hash of the first and last MiB catch replaced, truncated and appended files at once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from astrai_batch.errors import InputError

SAMPLE_BYTES = 1 << 20


def file_fingerprint(path: Path) -> dict[str, Any]:
    """{path, size, mtime_ns, sample_sha256} of one file; sample = first and last MiB."""
    resolved = path.resolve()
    try:
        stat = resolved.stat()
        digest = hashlib.sha256()
        with resolved.open("rb") as handle:
            digest.update(handle.read(SAMPLE_BYTES))
            if stat.st_size > SAMPLE_BYTES:
                # Starting no earlier than the head's end: a file under 2 MiB is hashed whole.
                handle.seek(max(SAMPLE_BYTES, stat.st_size - SAMPLE_BYTES))
                digest.update(handle.read(SAMPLE_BYTES))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return {
        "path": str(resolved),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sample_sha256": digest.hexdigest(),
    }


def files_fingerprint(input_format: str, paths: list[Path]) -> dict[str, Any]:
    """The fingerprint of a whole input: its format and every file, in reading order."""
    return {"format": input_format, "files": [file_fingerprint(path) for path in paths]}
