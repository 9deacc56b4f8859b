"""What a job reads and writes: the input and output formats, the input columns kept, the
image column, and the chat template's variables."""

from __future__ import annotations

from astrai_batch.errors import ConfigError
from astrai_batch.json_types import json_type

OUTPUT_FORMATS = ("parquet", "openai-jsonl", "parquet-dir")
INPUT_FORMAT_NAMES = ("parquet", "jsonl")
# The output format an OUTPUT's name tells (its extension, lowercased).
FORMAT_OF_EXTENSION = {".parquet": "parquet", ".jsonl": "openai-jsonl"}
OUTPUT_FORMAT_HINT = (
    "name it .parquet or .jsonl, or a directory (ending in /), or give "
    "--output-format parquet|openai-jsonl|parquet-dir"
)


def check_io_options(
    input_format: object,
    output_format: object,
    keep_columns: object,
    chat_template_kwargs: object,
) -> None:
    if input_format is not None and input_format not in INPUT_FORMAT_NAMES:
        raise ConfigError(f"input_format must be parquet or jsonl, got {input_format!r}")
    if output_format is not None and output_format not in OUTPUT_FORMATS:
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


def output_format_for(name: str, *, directory: bool, given: str | None) -> str:
    """The output format of an OUTPUT called `name` (`directory`: an existing directory or a
    name ending in /): `given` (--output-format) when the name does not contradict it, else
    what the name tells. A name that tells nothing needs `given`; a contradiction is refused.
    A parquet-dir may be named .parquet (as Spark names its directories)."""
    extension = "." + name.lower().rsplit(".", 1)[1] if "." in name.strip(".") else ""
    named = FORMAT_OF_EXTENSION.get(extension)
    if given is None:
        if directory:
            return "parquet-dir"
        if named is None:
            raise ConfigError(
                f"cannot tell the output format from the name {name!r}; {OUTPUT_FORMAT_HINT}"
            )
        return named
    compatible = named is None or named == given or (given, named) == ("parquet-dir", "parquet")
    if not compatible:
        raise ConfigError(
            f"--output-format {given} contradicts the output name {name!r} ({extension} is "
            f"{named}); give the output a matching name or drop --output-format"
        )
    return given


def check_image_options(image_column: object, prompt_column: object, task: object) -> None:
    """``--image-column``: a column name other than the prompt's, for generation (a scored
    or embedded row is text)."""
    if image_column is None:
        return
    if not isinstance(image_column, str) or not image_column:
        raise ConfigError(f"image_column must be a column name, got {json_type(image_column)}")
    if image_column == prompt_column:
        raise ConfigError(f"--image-column and --prompt-column both name {image_column!r}")
    if task != "generate":
        raise ConfigError(f"--image-column runs with --task generate, not --task {task}")
