"""`open_input`: pick the reader for a path, URI or glob (`input_files`) and check the input
as a whole up front.

Every file-level problem (missing path, unknown extension, unreadable or corrupt file, no
usable prompt column, a named column that does not exist) raises `InputError` here, before
any generation starts; problems with single rows surface later as `InputRow.error`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from astrai_batch.errors import ConfigError
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.io.image_sources import DEFAULT_MAX_IMAGES_PER_ROW
from astrai_batch.io.input_files import input_files
from astrai_batch.io.input_source import InputSource
from astrai_batch.io.jsonl_input import open_jsonl
from astrai_batch.io.parquet_input import open_parquet

INPUT_FORMATS = ("parquet", "jsonl")


def detect_format(path: Location) -> str:
    """'parquet' for a directory or a .parquet file, 'jsonl' for .jsonl / .jsonl.gz, 'arrow'
    for an .arrow file or a `datasets` directory (see `input_files`)."""
    return input_files(path, None)[0]


def open_input(
    path: str | os.PathLike[str] | Location,
    *,
    input_format: str | None = None,
    prompt_column: str | None = None,
    id_column: str | None = None,
    keep_columns: Sequence[str] = (),
    task: str = "generate",
    image_column: str | None = None,
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW,
) -> InputSource:
    """Open an input file or directory (a local path, or a URI of any filesystem pyarrow
    supports, see `filesystems.resolve`) for streaming; see `InputSource`."""
    if input_format is not None and input_format not in INPUT_FORMATS:
        raise ConfigError(f"input_format must be 'parquet' or 'jsonl', got {input_format!r}")
    if isinstance(keep_columns, str):
        raise ConfigError("keep_columns must be a sequence of column names, not one string")
    input_path = path if isinstance(path, Location) else resolve(path)
    chosen_format, files = input_files(input_path, input_format)
    if chosen_format == "jsonl":
        return open_jsonl(
            files[0],
            prompt_column=prompt_column,
            id_column=id_column,
            keep_columns=keep_columns,
            task=task,
            image_column=image_column,
            max_images_per_row=max_images_per_row,
        )
    return open_parquet(
        input_path,
        prompt_column=prompt_column,
        id_column=id_column,
        keep_columns=keep_columns,
        task=task,
        files=files,
        file_format=chosen_format,
        image_column=image_column,
        max_images_per_row=max_images_per_row,
    )
