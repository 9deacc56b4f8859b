"""Arrow IPC files as input parts: what the `datasets` library writes (`save_to_disk`'s
``data-00000-of-00001.arrow``, its cache's ``{name}-{split}.arrow``), read in place.

`datasets` writes the IPC *stream* format (record batches of 1,000 rows by default, no
footer); the IPC *file* format (a footer indexing the batches) is read too. A record batch
plays the part a Parquet row group plays: the open scan counts each batch's rows, and a read
from row `start` skips the batches before it. A local file is memory-mapped, so a skipped or
counted batch costs its metadata only and nothing is copied into memory; a remote one is
read as a stream (or by ranges, in the file format).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pyarrow as pa

from astrai_batch.io.filesystems import Location

ARROW_FILE_MAGIC = b"ARROW1"
Reader = pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader


@contextlib.contextmanager
def _opened(path: Location) -> Iterator[Reader]:
    """A reader of `path`'s record batches, in either IPC format."""
    source = pa.memory_map(path.path) if path.is_local else path.open_input_file()
    with source:
        head = source.read(len(ARROW_FILE_MAGIC))
        source.seek(0)
        if head == ARROW_FILE_MAGIC:
            yield pa.ipc.open_file(source)
        else:
            yield pa.ipc.open_stream(source)


def _batches(reader: Reader) -> Iterator[pa.RecordBatch]:
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        for number in range(reader.num_record_batches):
            yield reader.get_batch(number)
    else:
        yield from reader


def read_layout(path: Location) -> tuple[pa.Schema, tuple[int, ...]]:
    """The file's schema and the row count of each of its record batches."""
    with _opened(path) as reader:
        return reader.schema, tuple(batch.num_rows for batch in _batches(reader))


def read_batches(
    path: Location, columns: Sequence[str], groups: Sequence[int] | None, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """The record batches numbered `groups` (all when None), in order, only `columns`, each
    cut into pieces of at most `batch_rows` rows (a writer's batches may be large)."""
    wanted = None if groups is None else set(groups)
    last = None if groups is None else max(groups, default=-1)
    with _opened(path) as reader:
        if isinstance(reader, pa.ipc.RecordBatchFileReader) and groups is not None:
            numbered: Iterator[tuple[int, pa.RecordBatch]] = (
                (number, reader.get_batch(number)) for number in groups
            )
        else:
            numbered = enumerate(_batches(reader))
        for number, batch in numbered:
            if last is not None and number > last:
                return
            if wanted is not None and number not in wanted:
                continue
            batch = batch.select(list(columns))
            for offset in range(0, batch.num_rows, batch_rows):
                yield batch.slice(offset, batch_rows)
