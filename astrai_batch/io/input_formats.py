"""`open_input`: pick the reader for a path or URI and check the input as a whole up front.

Every file-level problem (missing path, unknown extension, unreadable or corrupt file, no
usable prompt column, a named column that does not exist) raises `InputError` here, before
any generation starts; problems with single rows surface later as `InputRow.error`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from astrai_batch.errors import ConfigError, InputError
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.io.image_sources import DEFAULT_MAX_IMAGES_PER_ROW
from astrai_batch.io.input_source import InputSource
from astrai_batch.io.jsonl_input import open_jsonl
from astrai_batch.io.parquet_input import open_parquet

INPUT_FORMATS = ("parquet", "jsonl")


def detect_format(path: Location) -> str:
    """'parquet' for a directory or a .parquet file, 'jsonl' for .jsonl / .jsonl.gz."""
    if path.is_dir(InputError):
        return "parquet"
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise InputError(
        f"cannot tell the input format of {path.name}: name it .parquet, .jsonl or .jsonl.gz, "
        "or pass --input-format parquet|jsonl"
    )


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
    if not input_path.exists(InputError):
        raise InputError(f"input not found: {input_path.shown}")
    chosen_format = input_format or detect_format(input_path)
    opener = open_parquet if chosen_format == "parquet" else open_jsonl
    return opener(
        input_path,
        prompt_column=prompt_column,
        id_column=id_column,
        keep_columns=keep_columns,
        task=task,
        image_column=image_column,
        max_images_per_row=max_images_per_row,
    )
