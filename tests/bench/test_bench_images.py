"""scripts/bench_images.py's job: row i shows image i mod --images, every image gets its share
of rows, no image is asked the same question twice, and a bad --images is refused."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_images.py"


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_images", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_job_rows_spread_distinct_questions_over_the_images():
    rows = bench_module().job_rows(25, 10)
    assert [image for image, _ in rows] == [i % 10 for i in range(25)]
    assert Counter(image for image, _ in rows) == Counter({i: 3 if i < 5 else 2 for i in range(10)})
    assert len(set(rows)) == 25
    assert rows[0] == (0, "Question 0: what is in this picture?")
    assert rows[10] == (0, "Question 1: what is in this picture?")


def test_job_rows_refuse_more_images_than_rows():
    with pytest.raises(ValueError, match=r"--images must be between 1 and --rows \(4\), got 5"):
        bench_module().job_rows(4, 5)
