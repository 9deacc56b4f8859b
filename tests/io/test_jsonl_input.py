from __future__ import annotations

import gzip
import inspect
import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from astrai_batch.errors import InputError
from astrai_batch.io import InputRow, open_input


def test_prompt_rows(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"prompt": "Hello", "id": 5}, {"prompt": "World", "id": "w"}])
    source = open_input(path)
    assert (source.format, source.shape) == ("jsonl", "prompt")
    assert source.columns() == ["prompt", "id"]
    assert source.count_rows() == 2
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="5", prompt="Hello"),
        InputRow(index=1, id="w", prompt="World"),
    ]


def test_messages_rows_accept_text_parts(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [
            {"messages": [{"role": "user", "content": "Hi", "name": "ann"}]},
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"text": "b"}],
                    }
                ]
            },
        ],
    )
    source = open_input(path)
    assert source.shape == "messages"
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="0", messages=({"role": "user", "content": "Hi"},)),
        InputRow(index=1, id="1", messages=({"role": "user", "content": "a\nb"},)),
    ]


def test_token_id_rows(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"prompt_token_ids": [3, 1, 4]}])
    source = open_input(path)
    assert source.shape == "prompt_token_ids"
    assert list(source.iter_rows()) == [InputRow(index=0, id="0", prompt_token_ids=(3, 1, 4))]


def test_gzip_by_suffix_and_by_magic_bytes(write_jsonl, tmp_path: Path) -> None:
    lines = [{"prompt": "a"}, {"prompt": "b"}]
    expected = [InputRow(index=0, id="0", prompt="a"), InputRow(index=1, id="1", prompt="b")]
    by_suffix = open_input(write_jsonl("in.jsonl.gz", lines, compress=True))
    assert by_suffix.compressed
    assert list(by_suffix.iter_rows()) == expected
    # Compressed content under a plain .jsonl name, and under any name with input_format.
    by_magic = open_input(write_jsonl("in.jsonl", lines, compress=True))
    assert by_magic.compressed
    assert list(by_magic.iter_rows()) == expected
    other = open_input(write_jsonl("prompts.txt", lines), input_format="jsonl")
    assert not other.compressed
    assert list(other.iter_rows()) == expected


def test_blank_lines_are_not_rows_and_line_numbers_stay_physical(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", ["", {"prompt": "a"}, "   ", "", "{broken", {"prompt": "b"}])
    source = open_input(path)
    assert source.count_rows() == 3
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="0", prompt="a"),
        InputRow(
            index=1,
            id="1",
            error="line 5: invalid JSON: Expecting property name enclosed in double quotes "
            "at column 2",
        ),
        InputRow(index=2, id="2", prompt="b"),
    ]


def test_lines_that_are_not_objects_are_error_rows(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl", ["not json", "[1, 2]", {"messages": [{"role": "u", "content": "x"}]}]
    )
    source = open_input(path)
    assert source.shape == "messages"
    assert source.columns() == ["messages"]
    assert [row.error for row in source.iter_rows()] == [
        "line 1: invalid JSON: Expecting value at column 1",
        "line 2: expected a JSON object, got list",
        None,
    ]


def test_ids_from_custom_id_and_id_column(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [
            {"prompt": "a", "custom_id": "c-1", "key": {"k": 1}},
            {"prompt": "b", "custom_id": "c-2", "key": None},
        ],
    )
    rows = list(open_input(path).iter_rows())
    assert [(row.id, row.custom_id) for row in rows] == [("c-1", "c-1"), ("c-2", "c-2")]
    rows = list(open_input(path, id_column="key").iter_rows())
    assert [(row.id, row.custom_id, row.error) for row in rows] == [
        ('{"k": 1}', "c-1", None),
        (None, "c-2", "key is missing"),
    ]


def test_overrides_and_keep_columns_as_json_text(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [
            # Columns are the keys of every line: `label` first appears on the second.
            {"prompt": "a", "temperature": 0, "stop": ["x"], "n": None, "meta": {"a": [1, 2]}},
            {"prompt": "b", "label": "keep me", "meta": 3},
            {"prompt": "c", "meta": True},
        ],
    )
    source = open_input(path, keep_columns=["meta", "label"])
    assert source.kept_schema() == pa.schema([("meta", pa.string()), ("label", pa.string())])
    rows = list(source.iter_rows())
    assert [row.overrides for row in rows] == [{"temperature": 0, "stop": ["x"]}, {}, {}]
    assert [row.kept for row in rows] == [
        {"meta": '{"a":[1,2]}', "label": None},
        {"meta": "3", "label": "keep me"},
        {"meta": "true", "label": None},
    ]


def test_keep_columns_keep_their_json_types(write_jsonl) -> None:
    """As pyarrow infers them over every line: integers and floats make double, objects
    structs with their fields merged, lists lists; a column without one type is JSON text."""
    path = write_jsonl(
        "in.jsonl",
        [
            {"prompt": "a", "n_id": 1, "score": 1, "tags": [], "meta": {"a": 1}, "mix": 1},
            {"prompt": "b", "n_id": 2, "score": 2.5, "tags": ["x"], "meta": {"b": "y"}},
            {"prompt": "c", "score": None, "tags": ["y", "z"], "meta": None, "mix": "one"},
            {"prompt": "d", "n_id": 2**70, "flag": True},
        ],
    )
    names = ["n_id", "score", "tags", "meta", "mix", "flag"]
    source = open_input(path, keep_columns=names)
    assert source.kept_schema() == pa.schema(
        [
            ("n_id", pa.string()),  # beyond int64: text, never rounded
            ("score", pa.float64()),
            ("tags", pa.list_(pa.string())),
            ("meta", pa.struct([("a", pa.int64()), ("b", pa.string())])),
            ("mix", pa.string()),
            ("flag", pa.bool_()),
        ]
    )
    kept = [row.kept for row in source.iter_rows()]
    assert [row["score"] for row in kept] == [1, 2.5, None, None]
    assert [row["meta"] for row in kept] == [{"a": 1}, {"b": "y"}, None, None]
    assert [row["mix"] for row in kept] == ["1", None, "one", None]
    assert [row["n_id"] for row in kept] == ["1", "2", None, str(2**70)]
    table = pa.Table.from_pylist(kept, schema=source.kept_schema())
    assert table.column("meta").to_pylist()[1] == {"a": None, "b": "y"}


def test_prompt_column_picks_the_shape_from_the_first_value(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [{"text": "t", "chat": [{"role": "user", "content": "c"}], "tokens": [9], "prompt": "p"}],
    )
    assert next(open_input(path, prompt_column="text").iter_rows()).prompt == "t"
    chat = open_input(path, prompt_column="chat")
    assert chat.shape == "messages"
    assert next(chat.iter_rows()).messages == ({"role": "user", "content": "c"},)
    tokens = open_input(path, prompt_column="tokens")
    assert tokens.shape == "prompt_token_ids"
    assert next(tokens.iter_rows()).prompt_token_ids == (9,)


@pytest.mark.parametrize("compress", [False, True])
def test_start_equals_the_tail(write_jsonl, compress: bool) -> None:
    lines = [{"prompt": f"p{i}"} if i % 4 else "" for i in range(40)] + ["oops"]
    source = open_input(write_jsonl("in.jsonl", lines, compress=compress))
    rows = list(source.iter_rows())
    assert len(rows) == source.count_rows() == 31
    for start in range(33):
        assert list(source.iter_rows(start)) == rows[start:]


def test_a_corrupt_tail_fails_the_open_before_any_row(tmp_path: Path) -> None:
    # Opening reads the file once through (ids, row count), so a truncated gzip stream is a
    # problem of the input as a whole, found before any row runs.
    text = "".join(f'{{"prompt": "row {i}", "id": {i}}}\n' for i in range(20_000))
    data = gzip.compress(text.encode(), compresslevel=1)
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(data[: len(data) - 64])
    with pytest.raises(
        InputError,
        match=r"^cannot read big\.jsonl\.gz: Compressed file ended before the end-of-stream "
        r"marker was reached$",
    ):
        open_input(path)


def test_rows_stream(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"prompt": "row {i}", "id": {i}}}\n' for i in range(5)))
    rows = open_input(path).iter_rows(start=2)
    assert inspect.isgenerator(rows)
    assert list(itertools.islice(rows, 2)) == [
        InputRow(index=2, id="2", prompt="row 2"),
        InputRow(index=3, id="3", prompt="row 3"),
    ]


def test_fingerprint(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"prompt": "a"}])
    fingerprint = open_input(path).fingerprint()
    assert fingerprint["format"] == "jsonl"
    assert [entry["path"] for entry in fingerprint["files"]] == [str(path.resolve())]


def test_byte_order_mark_and_crlf_line_ends(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n{"prompt": 1,}\r\n')
    assert list(open_input(path).iter_rows()) == [
        InputRow(index=0, id="0", prompt="a"),
        InputRow(index=1, id="1", prompt="b"),
        InputRow(
            index=2,
            id="2",
            error="line 3: invalid JSON: Expecting property name enclosed in double quotes "
            "at column 14",
        ),
    ]
