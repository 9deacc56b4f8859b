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

import io
import posixpath
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from astrai_batch.errors import AstraiBatchError, InputError, OutputError
from astrai_batch.io.atomic import AtomicFile
from astrai_batch.io.object_commit import CopyLimits, commit_object

_READ_CHUNK = 1 << 20


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

    def info(self, error: type[AstraiBatchError] = OutputError) -> pafs.FileInfo:
        """What is at this location; an unreachable filesystem raises `error`."""
        try:
            return self.fs.get_file_info(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise error(f"cannot reach {self.shown}: {exc}") from exc

    def exists(self, error: type[AstraiBatchError] = OutputError) -> bool:
        return self.info(error).type != pafs.FileType.NotFound

    def is_dir(self, error: type[AstraiBatchError] = OutputError) -> bool:
        return self.info(error).type == pafs.FileType.Directory

    def is_file(self, error: type[AstraiBatchError] = OutputError) -> bool:
        return self.info(error).type == pafs.FileType.File

    def same_place(self, other: Location) -> bool:
        """Whether both name one file (local paths compared resolved, links followed)."""
        if self.is_local and other.is_local:
            return Path(self.path).resolve() == Path(other.path).resolve()
        return type(self.fs) is type(other.fs) and self.path.rstrip("/") == other.path.rstrip("/")

    def make_dir(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def list_names(self) -> list[str]:
        """Names directly inside this directory (none when it does not exist)."""
        if not self.is_dir():
            return []
        return sorted(posixpath.basename(info.path) for info in self._entries())

    def files(self, error: type[AstraiBatchError] = OutputError) -> list[Location]:
        """The files directly inside this directory, in name order."""
        try:
            entries = self._entries()
        except (OSError, pa.ArrowException) as exc:
            raise error(f"cannot list {self.shown}: {exc}") from exc
        names = sorted(
            posixpath.basename(info.path) for info in entries if info.type == pafs.FileType.File
        )
        return [self.child(name) for name in names]

    def _entries(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path, allow_not_found=True)
        return self.fs.get_file_info(selector)

    def delete(self) -> None:
        info = self.info()
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif info.type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path)

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path, compression=None) as stream:
            return stream.read()

    def open_input_file(self) -> Any:
        """Random access (a remote object is read by ranges)."""
        return self.fs.open_input_file(self.path)

    def open_input_stream(self) -> Any:
        """Sequential reading of the bytes as stored (no decompression by file name)."""
        return self.fs.open_input_stream(self.path, compression=None)

    def open_lines(self, offset: int = 0) -> BinaryIO:
        """The bytes as stored from byte `offset` on, buffered, iterating by line like a
        local binary file (pyarrow's streams have no line iteration of their own). A remote
        object is read by ranges from `offset`, never from its start."""
        if not offset:
            return io.BufferedReader(self.open_input_stream(), buffer_size=_READ_CHUNK)
        handle = self.open_input_file()
        handle.seek(offset)
        return io.BufferedReader(handle, buffer_size=_READ_CHUNK)

    def read_parquet_schema(self) -> pa.Schema:
        with self.fs.open_input_file(self.path) as handle:
            return pq.read_schema(handle)

    def read_parquet(self, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open_input_file(self.path) as handle:
            return pq.read_table(handle, columns=columns)


def as_location(target: str | Path | Location) -> Location:
    return target if isinstance(target, Location) else resolve(target)


def resolve(target: str | Path, error: type[AstraiBatchError] = InputError) -> Location:
    """A `Location` for a local path or a filesystem URI (one pyarrow cannot open raises
    `error`). Credentials and endpoints come from the URI's options or the environment,
    as pyarrow reads them (e.g. AWS_ACCESS_KEY_ID, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS).
    ``hf://datasets/...`` is a Hugging Face dataset, on the hub or in its cache (`hub_datasets`)."""
    text = str(target)
    if text.startswith("hf://"):
        from astrai_batch.io.hub_datasets import hub_location  # huggingface_hub, lazily

        return hub_location(text, error)
    if not is_uri(text):
        path = Path(text)
        return Location(pafs.LocalFileSystem(), str(path.absolute()), str(path))
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (OSError, pa.ArrowException, ValueError) as exc:
        shown = shown_uri(text)  # pyarrow's message may repeat the URI, keys and all
        raise error(f"cannot open {shown}: {str(exc).replace(text, shown)}") from exc
    return Location(fs, path, shown_uri(text))


def shown_uri(text: str) -> str:
    """A URI as messages name it: without its credentials (``user:secret@``) or options."""
    scheme, rest = text.split("?", 1)[0].split("://", 1)
    return f"{scheme}://{rest.rpartition('@')[2]}"


class AtomicObject:
    """Like `AtomicFile`, on any filesystem: `handle` to write, then `commit` or `abort`.
    On an object store the commit moves the temporary object onto the target; above
    `limits.max_copy_bytes` by a multipart copy (`object_commit`), as S3 requires."""

    def __init__(
        self, target: Location, *, overwrite: bool = False, limits: CopyLimits | None = None
    ) -> None:
        self.target = target
        self.overwrite = overwrite
        self.limits = limits or CopyLimits()
        self._local: AtomicFile | None = None
        if target.is_local:
            self._local = AtomicFile(target.local_path, overwrite=overwrite)
            self.handle: Any = self._local.handle
            self.state = "open"
            return
        self._refuse_existing()
        self.temp = target.sibling(f".{target.name}.tmp-{secrets.token_hex(6)}")
        try:
            self.handle = target.fs.open_output_stream(self.temp.path, compression=None)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(f"cannot write {target.shown}: {exc}") from exc
        self.state = "open"

    def require_open(self) -> None:
        if self._local is not None:
            self._local.require_open()
        elif self.state != "open":
            raise OutputError(f"output {self.target.shown} is already {self.state}")

    def check_invariants(self) -> None:
        """As `AtomicFile.check_invariants`: only an open writer has a temporary object."""
        if self._local is not None:
            self._local.check_invariants()
            return
        if self.state != "open" and self.temp.exists():
            raise OutputError(f"{self.state} writer left {self.temp.shown} behind")
        if self.state == "committed" and not self.target.exists():
            raise OutputError(f"committed writer but {self.target.shown} is missing")

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
        self.require_open()
        try:
            self.handle.close()
            self._refuse_existing()
            commit_object(self.target.fs, self.temp.path, self.target.path, self.limits)
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
