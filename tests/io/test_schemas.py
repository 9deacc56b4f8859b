from __future__ import annotations

import re

import pyarrow as pa
import pytest

from astrai_batch.errors import ConfigError
from astrai_batch.io import RESULT_SCHEMA, STATS_SCHEMA, result_schema

BASE = [
    ("id", "string", True),
    ("sample_index", "int32", False),
    ("completion", "string", True),
    ("finish_reason", "string", False),
    ("prompt_tokens", "int32", True),
    ("cached_tokens", "int32", True),
    ("completion_tokens", "int32", True),
    ("prefix_group", "int64", True),
    ("error", "string", True),
]


def layout(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    return [(field.name, str(field.type), field.nullable) for field in schema]


def test_result_schema_base_columns() -> None:
    assert layout(RESULT_SCHEMA) == BASE
    assert result_schema(save_tokens=False, logprobs=False, kept=None) == RESULT_SCHEMA


def test_result_schema_optional_columns_in_order() -> None:
    kept = pa.schema([pa.field("topic", pa.string(), nullable=False), ("score", pa.float64())])
    schema = result_schema(save_tokens=True, logprobs=True, kept=kept)
    assert layout(schema) == [
        *BASE,
        ("completion_token_ids", "list<item: int32>", True),
        ("logprobs", "list<item: float>", True),
        ("topic", "string", True),
        ("score", "double", True),
    ]
    assert layout(result_schema(save_tokens=False, logprobs=True, kept=None)) == [
        *BASE,
        ("logprobs", "list<item: float>", True),
    ]


def test_kept_column_may_not_shadow_a_result_column() -> None:
    message = (
        "keep column 'completion' has the name of a result column; "
        "rename it in the input or leave it out of keep_columns"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        result_schema(False, False, pa.schema([("completion", pa.string())]))
    with pytest.raises(ConfigError, match="'logprobs' has the name of a result column"):
        result_schema(False, True, pa.schema([("logprobs", pa.string())]))
    assert result_schema(False, False, pa.schema([("logprobs", pa.string())])).names[-1] == (
        "logprobs"
    )


def test_stats_schema() -> None:
    assert layout(STATS_SCHEMA) == [
        ("window", "int32", True),
        ("is_total", "bool", False),
        ("rows", "int64", True),
        ("prompt_tokens", "int64", True),
        ("cached_tokens", "int64", True),
        ("hit_rate", "double", True),
        ("prefill_tokens_computed", "int64", True),
        ("decode_tokens", "int64", True),
        ("evicted_pages", "int64", True),
        ("preemptions", "int64", True),
        ("peak_kv_pages", "int64", True),
        ("wall_seconds", "double", True),
        ("tokens_per_second", "double", True),
        ("constrained_rows", "int64", True),
        ("grammars_compiled", "int64", True),
        ("grammar_compile_seconds", "double", True),
        ("mask_fill_seconds", "double", True),
        ("images_encoded", "int64", True),
        ("image_encodes_saved", "int64", True),
        ("image_tokens_cached", "int64", True),
    ]
