"""Row ids: numbered only without any id field, never made up, never repeated."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.io import InputRow, open_input
from astrai_batch.io.row_ids import DuplicateIds, IdScan


def rows_of(path: Path, **options) -> list[tuple[str | None, str | None, str | None]]:
    return [(row.id, row.custom_id, row.error) for row in open_input(path, **options).iter_rows()]


def test_rows_are_numbered_only_when_no_row_has_an_id(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    assert rows_of(path) == [("0", None, None), ("1", None, None)]


def test_a_later_id_makes_earlier_rows_without_one_errors_not_numbers(write_jsonl) -> None:
    # Numbering rows 0 and 1 would collide with the id "0" the third row brings.
    path = write_jsonl("in.jsonl", [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "id": "0"}])
    assert rows_of(path) == [
        (None, None, "id is missing"),
        (None, None, "id is missing"),
        ("0", None, None),
    ]
    # Reading from any position gives the same answer: the whole file decides.
    source = open_input(path)
    assert list(source.iter_rows(start=1)) == list(source.iter_rows())[1:]


def test_null_id_is_missing_and_id_column_names_the_field(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"prompt": "a", "id": None, "key": 1}, {"prompt": "b"}])
    assert rows_of(path) == [(None, None, "id is missing"), (None, None, "id is missing")]
    assert rows_of(path, id_column="key") == [("1", None, None), (None, None, "key is missing")]


def test_duplicate_ids_in_jsonl_are_errors_on_the_later_rows(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [
            {"id": "x", "prompt": "a"},
            {"id": "y", "prompt": "b"},
            {"id": "x", "prompt": "c"},
            {"id": 7, "prompt": "d"},
            {"id": "7", "prompt": "e"},  # ids are text: 7 and "7" are one id
            {"id": "x", "prompt": 5},  # the id problem is reported first
            {"id": 'say "hi"\n', "prompt": "f"},
            {"id": 'say "hi"\n', "prompt": "g"},
        ],
    )
    source = open_input(path)
    assert len(source.duplicates) == 4
    source.check_invariants()
    assert rows_of(path) == [
        ("x", None, None),
        ("y", None, None),
        (None, None, "duplicate id 'x' (first at row 0)"),
        ("7", None, None),
        (None, None, "duplicate id '7' (first at row 3)"),
        (None, None, "duplicate id 'x' (first at row 0)"),
        ('say "hi"\n', None, None),
        (None, None, "duplicate id 'say \\\"hi\\\"\\n' (first at row 6)"),
    ]
    # A resumed read from row 4 finds the same duplicates as a read from the start.
    tail = [(row.id, row.error) for row in source.iter_rows(start=4)]
    assert tail == [(row.id, row.error) for row in source.iter_rows()][4:]


def test_duplicate_custom_ids_in_openai_input(write_jsonl) -> None:
    def request(custom_id: str, text: str) -> dict:
        return {"custom_id": custom_id, "body": {"messages": [{"role": "user", "content": text}]}}

    path = write_jsonl(
        "batch.jsonl",
        [request("r1", "a"), request("r2", "b"), request("r1", "c"), request("r3", "d")],
    )
    assert rows_of(path) == [
        ("r1", "r1", None),
        ("r2", "r2", None),
        (None, None, "duplicate id 'r1' (first at row 0)"),
        ("r3", "r3", None),
    ]


def test_an_id_and_a_custom_id_share_one_namespace(write_jsonl) -> None:
    # OpenAI output echoes custom_id, or the row id where a row has none: both must be unique.
    path = write_jsonl(
        "in.jsonl",
        [
            {"id": "a", "custom_id": "b", "prompt": "p"},
            {"id": "b", "prompt": "q"},
            {"id": "c", "custom_id": "a", "prompt": "r"},
            {"id": "d", "custom_id": "d", "prompt": "s"},
        ],
    )
    assert rows_of(path) == [
        ("a", "b", None),
        (None, None, "duplicate id 'b' (first at row 0)"),
        ("c", None, "duplicate custom_id 'a' (first at row 0)"),
        ("d", "d", None),
    ]


def test_duplicate_ids_in_a_parquet_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["a", "b"]}), data / "part-0.parquet")
    pq.write_table(
        pa.table({"id": [3, 1, None], "prompt": ["c", "d", "e"]}), data / "part-1.parquet"
    )
    source = open_input(data)
    source.check_invariants()
    assert list(source.iter_rows(start=3)) == [
        InputRow(index=3, id=None, error="duplicate id '1' (first at row 0)"),
        InputRow(index=4, id=None, error="id is missing"),
    ]
    assert [row.id for row in source.iter_rows()] == ["1", "2", "3", None, None]


def test_a_parquet_input_without_id_columns_reads_no_ids(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["a", "a"]}), path)
    source = open_input(path)
    assert len(source.duplicates) == 0
    assert [row.id for row in source.iter_rows()] == ["0", "1"]


def test_duplicates_agree_with_a_brute_force_count() -> None:
    # Many repeats of few ids, with custom_ids that sometimes equal ids of other rows.
    generator = random.Random(7)
    identities = [
        (
            f"i{generator.randrange(300)}",
            generator.choice([None, None, f"i{generator.randrange(300)}"]),
        )
        for _ in range(2000)
    ]
    scan = IdScan()
    for index, (row_id, custom_id) in enumerate(identities):
        scan.add(index, row_id, custom_id)
    duplicates = scan.duplicates()
    duplicates.check_invariants()

    first_row: dict[str, int] = {}
    expected = []
    for index, (row_id, custom_id) in enumerate(identities):
        texts = [row_id] + ([custom_id] if custom_id not in (None, row_id) else [])
        firsts = [first_row.get(text) for text in texts]
        expected.append((firsts[0], firsts[1] if len(firsts) > 1 else None))
        for text in texts:
            first_row.setdefault(text, index)
    assert [duplicates.first_rows(index) for index in range(len(identities))] == expected
    assert len(duplicates) == sum(first is not None for pair in expected for first in pair)


def test_duplicate_invariants_catch_unsorted_or_later_first_rows() -> None:
    def ids(rows: list[int], kinds: list[int], firsts: list[int]) -> DuplicateIds:
        return DuplicateIds(
            np.array(rows, dtype=np.int64),
            np.array(kinds, dtype=np.uint8),
            np.array(firsts, dtype=np.int64),
        )

    ids([2, 2, 5], [0, 1, 0], [0, 1, 2]).check_invariants()
    with pytest.raises(ValueError, match=r"^duplicate entries are not sorted"):
        ids([5, 2], [0, 0], [0, 0]).check_invariants()
    with pytest.raises(ValueError, match=r"^a duplicate's first row is not an earlier row$"):
        ids([2], [0], [2]).check_invariants()
