"""A real pyarrow filesystem seen through a `pyarrow.fs.PyFileSystem` handler that records
every byte range read from it and can hold read responses back (a slow network). Nothing is
faked: every call goes to the wrapped filesystem (local disk, or moto's S3 server)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from astrai_batch.io.filesystems import Location


@dataclass
class ReadLog:
    """(path, offset, bytes) of every read, in order; `stall` holds read responses back
    until `release` is set."""

    reads: list[tuple[str, int, int]] = field(default_factory=list)
    stall: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def bytes_read(self, path: str) -> int:
        return sum(size for name, _, size in self.reads if name == path)

    def lowest_offset(self, path: str) -> int | None:
        offsets = [offset for name, offset, size in self.reads if name == path and size]
        return min(offsets) if offsets else None

    def clear(self) -> None:
        self.reads.clear()


class _CountingFile:
    """A random-access file that logs each read's offset and size."""

    def __init__(self, inner: Any, path: str, log: ReadLog) -> None:
        self.inner, self.path, self.log = inner, path, log
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        offset = self.inner.tell()
        data = self.inner.read() if size is None or size < 0 else self.inner.read(size)
        self.log.reads.append((self.path, offset, len(data)))
        if self.log.stall.is_set():
            self.log.release.wait()
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def size(self) -> int:
        return self.inner.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class CountingHandler(pafs.FileSystemHandler):
    def __init__(self, base: pafs.FileSystem, log: ReadLog) -> None:
        self.base, self.log = base, log

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CountingHandler) and other.base.equals(self.base)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return self.base.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.base.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.base.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.base.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.base.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not in tests")

    def delete_file(self, path: str) -> None:
        self.base.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.base.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.base.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return pa.PythonFile(_CountingFile(self.base.open_input_file(path), path, self.log), "r")

    def open_input_file(self, path: str) -> Any:
        return pa.PythonFile(_CountingFile(self.base.open_input_file(path), path, self.log), "r")

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.base.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.base.open_append_stream(path, metadata=metadata)


def counted(location: Location, log: ReadLog) -> Location:
    """`location` on the same filesystem, read through the logging handler."""
    return Location(
        pafs.PyFileSystem(CountingHandler(location.fs, log)), location.path, location.shown
    )
