"""Paths and URIs on any filesystem pyarrow supports, with the same atomic-commit rule.

A job's INPUT and OUTPUT may be local paths or URIs (``s3://``, ``gs://``, ``hdfs://``,
``file://``); `resolve` turns either into a `Location`: a pyarrow filesystem plus a path on
it. Filesystem objects pickle with their options (endpoint, region), so a `Location` can be
handed to workers on other machines.

Writes keep the local rule "readers see nothing or the whole file": data goes to a temporary
object beside the target (``.{name}.tmp-{random}``) and is moved onto the target only when
complete; an abandoned temporary object is never visible under the target's name. On a
local filesystem the existing `AtomicFile` (fsync, rename, directory fsync) does the work.
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from astrai_batch.errors import InputError, OutputError
from astrai_batch.io.atomic import AtomicFile


def is_uri(text: str) -> bool:
    """True for ``scheme://...`` (a URI), False for a plain local path."""
    head, sep, _ = str(text).partition("://")
    return bool(sep) and head.isidentifier()


@dataclass(frozen=True)
class Location:
    """A file or directory on some filesystem. `shown` is how messages name it."""

    fs: pafs.FileSystem
    path: str
    shown: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise OutputError(f"{self.shown} is not on the local filesystem")
        return Path(self.path)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> Location:
        path = posixpath.dirname(self.path.rstrip("/"))
        return Location(self.fs, path, posixpath.dirname(self.shown.rstrip("/")))

    def child(self, name: str) -> Location:
        path = f"{self.path.rstrip('/')}/{name}"
        return Location(self.fs, path, posixpath.join(self.shown, name) if self.shown else name)

    def sibling(self, name: str) -> Location:
        return self.parent.child(name)

    def info(self) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(f"cannot reach {self.shown}: {exc}") from exc

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def make_dir(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def list_names(self) -> list[str]:
        """Names directly inside this directory (none when it does not exist)."""
        if not self.is_dir():
            return []
        selector = pafs.FileSelector(self.path, allow_not_found=True)
        return sorted(posixpath.basename(info.path) for info in self.fs.get_file_info(selector))

    def delete(self) -> None:
        info = self.info()
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif info.type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path)

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def open_input_file(self) -> Any:
        return self.fs.open_input_file(self.path)

    def read_parquet_schema(self) -> pa.Schema:
        with self.fs.open_input_file(self.path) as handle:
            return pq.read_schema(handle)


def resolve(target: str | Path) -> Location:
    """A `Location` for a local path or a filesystem URI."""
    text = str(target)
    if not is_uri(text):
        path = Path(text).absolute()
        return Location(pafs.LocalFileSystem(), str(path), text)
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise InputError(f"cannot open {text}: {exc}") from exc
    return Location(fs, path, shown_uri(text))


def shown_uri(text: str) -> str:
    """A URI as messages name it: without its credentials (``user:secret@``) or options."""
    scheme, rest = text.split("?", 1)[0].split("://", 1)
    return f"{scheme}://{rest.rpartition('@')[2]}"


class AtomicObject:
    """Like `AtomicFile`, on any filesystem: `handle` to write, then `commit` or `abort`."""

    def __init__(self, target: Location, *, overwrite: bool = False) -> None:
        self.target = target
        self.overwrite = overwrite
        self._local: AtomicFile | None = None
        if target.is_local:
            self._local = AtomicFile(target.local_path, overwrite=overwrite)
            self.handle: Any = self._local.handle
            self.state = "open"
            return
        self._refuse_existing()
        self.temp = target.sibling(f".{target.name}.tmp-{secrets.token_hex(6)}")
        try:
            self.handle = target.fs.open_output_stream(self.temp.path)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(f"cannot write {target.shown}: {exc}") from exc
        self.state = "open"

    def _refuse_existing(self) -> None:
        if not self.overwrite and self.target.exists():
            raise OutputError(
                f"output {self.target.shown} already exists; pass --overwrite to replace it"
            )

    def commit(self) -> None:
        if self._local is not None:
            self._local.commit()
            self.state = self._local.state
            return
        if self.state != "open":
            raise OutputError(f"output {self.target.shown} is already {self.state}")
        try:
            self.handle.close()
            self._refuse_existing()
            self.target.fs.move(self.temp.path, self.target.path)
        except (OSError, pa.ArrowException) as exc:
            self.abort()
            raise OutputError(f"cannot write {self.target.shown}: {exc}") from exc
        except BaseException:
            self.abort()
            raise
        self.state = "committed"

    def abort(self) -> None:
        if self._local is not None:
            self._local.abort()
            self.state = self._local.state
            return
        if self.state != "open":
            return
        self.state = "aborted"
        try:
            if not self.handle.closed:
                self.handle.close()
        finally:
            self.temp.delete()


def write_table_at(
    target: Location,
    table: pa.Table,
    *,
    metadata: dict[str, str] | None = None,
    overwrite: bool = False,
    row_group_size: int | None = None,
) -> None:
    """One table as a Parquet file at `target`, atomically; `metadata` joins its schema's."""
    if metadata:
        merged = {
            **(table.schema.metadata or {}),
            **{k.encode(): v.encode() for k, v in metadata.items()},
        }
        table = table.replace_schema_metadata(merged)
    output = AtomicObject(target, overwrite=overwrite)
    try:
        pq.write_table(table, output.handle, row_group_size=row_group_size)
    except BaseException:
        output.abort()
        raise
    output.commit()
