"""Reading prompt datasets and writing results. Knows nothing of torch or models.

Input: `open_input` returns an `InputSource` that streams `InputRow`s from Parquet (a file, a
directory of files or a glob), Arrow IPC files (a `datasets` directory) or JSON Lines
(optionally gzipped), given as a local path, a URI of any filesystem pyarrow supports
(`filesystems`) or a Hugging Face dataset (``hf://datasets/...``, `hub_datasets`); every
record is read by its own shape and id, and repeated ids are found when the input is opened
(`row_ids`).
Output: `ParquetRowWriter` and `write_table_atomic` write Parquet atomically with the schemas
in `schemas`; `OpenAIBatchWriter` writes OpenAI Batch API output lines.
"""

from __future__ import annotations

from astrai_batch.io.atomic import AtomicFile
from astrai_batch.io.input_formats import INPUT_FORMATS, detect_format, open_input
from astrai_batch.io.input_source import InputSource
from astrai_batch.io.jsonl_input import JsonlSource
from astrai_batch.io.openai_jsonl import OpenAIBatchWriter, openai_response_body
from astrai_batch.io.parquet_input import ParquetSource
from astrai_batch.io.parquet_writer import (
    ParquetRowWriter,
    read_parquet_metadata,
    read_parquet_rows,
    write_table_atomic,
)
from astrai_batch.io.rows import OVERRIDE_FIELDS, SHAPES, SOURCE_SHAPES, InputRow, RowPlan
from astrai_batch.io.schemas import (
    FINISH_REASONS,
    RESULT_SCHEMA,
    STATS_SCHEMA,
    result_schema,
)

__all__ = [
    "FINISH_REASONS",
    "INPUT_FORMATS",
    "OVERRIDE_FIELDS",
    "RESULT_SCHEMA",
    "SHAPES",
    "SOURCE_SHAPES",
    "STATS_SCHEMA",
    "AtomicFile",
    "InputRow",
    "InputSource",
    "JsonlSource",
    "OpenAIBatchWriter",
    "ParquetRowWriter",
    "ParquetSource",
    "RowPlan",
    "detect_format",
    "open_input",
    "openai_response_body",
    "read_parquet_metadata",
    "read_parquet_rows",
    "result_schema",
    "write_table_atomic",
]
