"""Where a JSON Lines file stores a row's data URL, and reading it again when needed.

An OpenAI chat line carries its images inline, as base64 ``data:`` URLs of tens of kilobytes
to megabytes each. A row waiting in its window (up to ``--group-window`` rows) would hold
them all; instead, the JSONL reader names each large data URL by its bytes' place in the
file (`DataUrlSpan`: the file, the byte range, a CRC-32 of those bytes), as the Parquet
reader names an image cell (`io.image_cells`), and the job reads the range again when it
prepares the row's window and when the row's request enters the engine: one ranged read of
exactly the URL's bytes, on any filesystem.

A span is only taken where it is exact: a plain (not gzip) file, and the URL's text found
as is in the line's bytes (a JSON writer that escapes ``/`` as ``\\/`` stores other bytes:
that URL stays in the row). Data URLs shorter than `MIN_SPAN_CHARS` stay in the row too
(a read costs more than they weigh). A range that no longer holds the same bytes (the file
was changed or truncated between the two reads) fails the row: ``the image changed after
the job first read it``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pyarrow as pa

from astrai_batch.errors import ImageError
from astrai_batch.io.filesystems import Location

MIN_SPAN_CHARS = 4096  # shorter data URLs stay in the row


@dataclass(frozen=True, slots=True)
class DataUrlSpan:
    """A data URL stored in `file` at bytes [`start`, `start` + `length`), whose CRC-32 is
    `crc`; `media` is its media type (``image/png``), for messages."""

    file: Location
    start: int
    length: int
    crc: int
    media: str

    def __post_init__(self) -> None:
        if self.start < 0 or self.length <= 0:
            raise ValueError(f"a span needs start >= 0 and length > 0, got {self}")

    @property
    def shown(self) -> str:
        media = self.media or "no media type"
        return f"data URL ({media}, {self.length:,} characters)"


def locate_data_url(url: str, raw: bytes, file: Location, line_start: int) -> DataUrlSpan | None:
    """The span of `url` inside the line `raw`, which starts at byte `line_start` of `file`;
    None where a span would not be exact or not worth it (see the module docstring)."""
    if len(url) < MIN_SPAN_CHARS or url[:5].lower() != "data:":
        return None
    try:
        text = url.encode("ascii")
    except UnicodeEncodeError:  # not a valid data URL: its error comes from the URL itself
        return None
    position = raw.find(text)
    if position < 0:
        return None
    media = url[5:].split(",", 1)[0].split(";", 1)[0]
    return DataUrlSpan(file, line_start + position, len(text), zlib.crc32(text), media)


def read_data_url(span: DataUrlSpan) -> str:
    """The data URL stored at `span`, read again; `ImageError` when the file cannot be read
    or the range no longer holds the bytes the job first read."""
    file = span.file
    try:
        with file.open_input_file() as handle:
            data = handle.read_at(span.length, span.start)
    except FileNotFoundError:
        raise ImageError(f"{file.shown} is gone: its images cannot be read again") from None
    except (OSError, pa.ArrowException) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ImageError(f"{file.shown} cannot be read again for its images: {text}") from None
    if len(data) != span.length or zlib.crc32(data) != span.crc:
        raise ImageError(f"image {span.shown} changed after the job first read it")
    return bytes(data).decode("ascii")
