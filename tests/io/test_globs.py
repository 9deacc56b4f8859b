"""Glob inputs match what Python's own `glob` matches (the reference), on local paths."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from astrai_batch.errors import InputError
from astrai_batch.io.filesystems import resolve
from astrai_batch.io.globs import glob_files

FILES = (
    "a.parquet",
    "b.parquet",
    ".hidden.parquet",
    "c.jsonl",
    "data/train-00000-of-00002.parquet",
    "data/train-00001-of-00002.parquet",
    "data/test-00000-of-00001.parquet",
    "data/.cache/x.parquet",
    "deep/er/still/z.parquet",
    "x1y.parquet",
    "x22y.parquet",
)
PATTERNS = (
    "*.parquet",
    "?.parquet",
    "[ab].parquet",
    "[!a].parquet",
    "x?y.parquet",
    "data/train-*.parquet",
    "data/*-0000[0-9]-of-*.parquet",
    "*/*.parquet",
    "**/*.parquet",
    "**/train-*",
    "deep/**/*.parquet",
    "data/**",
    "*",
    "nothing-*.parquet",
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    return tmp_path


@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_what_python_glob_matches(tree: Path, pattern: str) -> None:
    expected = sorted(
        name
        for name in glob.glob(pattern, root_dir=tree, recursive=True)
        if (tree / name).is_file()
    )
    got = glob_files(resolve(f"{tree}/{pattern}"))
    assert [file.path[len(str(tree)) + 1 :] for file in got] == expected
    assert all(file.shown == f"{tree}/{file.path[len(str(tree)) + 1 :]}" for file in got)


def test_a_glob_of_mixed_formats_is_refused(tree: Path) -> None:
    from astrai_batch.io import open_input

    with pytest.raises(InputError) as mixed:
        open_input(f"{tree}/*")
    assert str(mixed.value) == (
        f"{tree}/* matches files of several or unknown formats (jsonl, parquet): make the glob "
        "match only .parquet files, only .arrow files, or one .jsonl file"
    )
