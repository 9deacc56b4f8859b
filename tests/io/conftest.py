"""Helpers for io tests: write small input files the way users would."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

JsonlWriter = Callable[..., Path]


@pytest.fixture
def write_jsonl(tmp_path: Path) -> JsonlWriter:
    """write_jsonl(name, lines, compress=False): dicts become JSON, str lines stay verbatim."""

    def write(name: str, lines: Sequence[Any], *, compress: bool = False) -> Path:
        text = "".join(
            (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines
        )
        path = tmp_path / name
        data = text.encode("utf-8")
        path.write_bytes(gzip.compress(data) if compress else data)
        return path

    return write
