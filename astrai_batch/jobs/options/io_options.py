"""What a job reads and writes: the input and output formats, the input columns kept, and the
chat template's variables."""

from __future__ import annotations

from astrai_batch.errors import ConfigError
from astrai_batch.json_types import json_type

OUTPUT_FORMATS = ("parquet", "openai-jsonl", "parquet-dir")
INPUT_FORMAT_NAMES = ("parquet", "jsonl")


def check_io_options(
    input_format: object,
    output_format: object,
    keep_columns: object,
    chat_template_kwargs: object,
) -> None:
    if input_format is not None and input_format not in INPUT_FORMAT_NAMES:
        raise ConfigError(f"input_format must be parquet or jsonl, got {input_format!r}")
    if output_format not in OUTPUT_FORMATS:
        raise ConfigError(
            f"output_format must be parquet, openai-jsonl or parquet-dir, got {output_format!r}"
        )
    if not isinstance(keep_columns, tuple) or not all(
        isinstance(name, str) and name for name in keep_columns
    ):
        raise ConfigError(f"keep_columns must be column names, got {keep_columns!r}")
    kwargs = chat_template_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"chat_template_kwargs must be an object, got {json_type(kwargs)}")
