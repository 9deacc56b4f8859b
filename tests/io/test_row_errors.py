"""Every documented row-level error message; bad rows never stop iteration."""

from __future__ import annotations

from pathlib import Path

import pytest

from astrai_batch.io import InputRow, open_input

PROMPT_CASES = [
    ('{"prompt": null}', "prompt is missing"),
    ('{"other": 1}', "row has no prompt, messages, prompt_token_ids or body"),
    ('{"prompt": ""}', "prompt is empty"),
    ('{"prompt": 5}', "prompt must be a string, got integer"),
    ('{"prompt": ["a"]}', "prompt must be a string, got list"),
    ('{"prompt": {"text": "a"}}', "prompt must be a string, got object"),
    ("nope", "line 2: invalid JSON: Expecting value at column 1"),
    ('{"prompt" "a"}', "line 2: invalid JSON: Expecting ':' delimiter at column 11"),
    # json's message ends in "at": the column follows it without a second "at"
    ('{"prompt": "abc', "line 2: invalid JSON: Unterminated string starting at column 12"),
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ('"text"', "line 2: expected a JSON object, got string"),
    ("3", "line 2: expected a JSON object, got integer"),
    ("null", "line 2: expected a JSON object, got null"),
    ("true", "line 2: expected a JSON object, got boolean"),
]

MESSAGE_CASES = [
    ('{"messages": null}', "messages is missing"),
    ('{"messages": []}', "messages is empty"),
    ('{"messages": "hi"}', "messages must be a list of {role, content} objects, got string"),
    ('{"messages": ["hi"]}', "messages[0] must be a {role, content} object, got string"),
    (
        '{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}',
        "messages[1] has no role",
    ),
    (
        '{"messages": [{"role": "user"}]}',
        "messages[0] has no content",
    ),
    (
        '{"messages": [{"role": "user", "content": 3}]}',
        "messages[0] content must be a string or a list of content parts, got integer",
    ),
    (
        '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
        "messages[0] content[0] image_url has no url",
    ),
    (
        '{"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}',
        "messages[0] has a input_audio content part; only text and image_url are supported",
    ),
    (
        '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}',
        "messages[0] content[0] has no text",
    ),
    (
        '{"messages": [{"role": "user", "content": []}]}',
        "messages[0] has no content",
    ),
    (
        '{"messages": [{"role": "user", "content": ["a"]}]}',
        "messages[0] content[0] must be a content part object, got string",
    ),
    (
        '{"messages": [{"role": 1, "content": "a"}]}',
        "messages[0] role must be a string, got integer",
    ),
]

TOKEN_CASES = [
    ('{"prompt_token_ids": null}', "prompt_token_ids is missing"),
    ('{"prompt_token_ids": []}', "prompt_token_ids is empty"),
    (
        '{"prompt_token_ids": "1 2"}',
        "prompt_token_ids must be a list of non-negative integers, got string",
    ),
    (
        '{"prompt_token_ids": [1, -1]}',
        "prompt_token_ids[1] must be a non-negative integer, got -1",
    ),
    (
        '{"prompt_token_ids": [true]}',
        "prompt_token_ids[0] must be a non-negative integer, got boolean",
    ),
    (
        '{"prompt_token_ids": [1.5]}',
        "prompt_token_ids[0] must be a non-negative integer, got number",
    ),
]

FIRST_LINES = {
    "prompt": '{"prompt": "ok", "tag": "t0"}',
    "messages": '{"messages": [{"role": "user", "content": "ok"}], "tag": "t0"}',
    "prompt_token_ids": '{"prompt_token_ids": [1], "tag": "t0"}',
}


def second_row(tmp_path: Path, shape: str, bad_line: str) -> InputRow:
    path = tmp_path / "in.jsonl"
    path.write_text(f"{FIRST_LINES[shape]}\n{bad_line}\n{FIRST_LINES[shape]}\n")
    rows = list(open_input(path, keep_columns=["tag"]).iter_rows())
    assert len(rows) == 3
    assert rows[0].error is None and rows[2].error is None
    return rows[1]


@pytest.mark.parametrize(
    ("shape", "line", "message"),
    [("prompt", *case) for case in PROMPT_CASES]
    + [("messages", *case) for case in MESSAGE_CASES]
    + [("prompt_token_ids", *case) for case in TOKEN_CASES],
)
def test_bad_row_message(tmp_path: Path, shape: str, line: str, message: str) -> None:
    row = second_row(tmp_path, shape, line)
    assert row.error == message
    assert (row.prompt, row.messages, row.prompt_token_ids) == (None, None, None)
    assert row.overrides == {}
    assert row.index == 1


def test_error_rows_keep_their_id_and_kept_values(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"prompt": "ok", "id": "a", "tag": "t0"}\n'
        '{"prompt": 1, "id": "x", "tag": "t1", "seed": 3}\n'
        "{\n"
    )
    rows = list(open_input(path, keep_columns=["tag"]).iter_rows())
    assert rows[1] == InputRow(
        index=1, id="x", kept={"tag": "t1"}, error="prompt must be a string, got integer"
    )
    # The input has ids, so an unreadable line's id is unknown: none, never its row number.
    assert rows[2] == InputRow(
        index=2,
        id=None,
        kept={"tag": None},
        error="line 3: invalid JSON: Expecting property name enclosed in double quotes at column 2",
    )
    # Without ids anywhere, rows are numbered, unreadable ones included.
    unreadable = second_row(tmp_path, "prompt", "{")
    assert unreadable == InputRow(
        index=1,
        id="1",
        kept={"tag": None},
        error="line 2: invalid JSON: Expecting property name enclosed in double quotes at column 2",
    )


def test_invalid_utf8_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    rows = list(open_input(path).iter_rows())
    assert rows[1] == InputRow(index=1, id="1", error="line 2: invalid UTF-8 at byte 15")


def test_parquet_rows_use_the_same_messages(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["ok", None, ""]}), path)
    assert [row.error for row in open_input(path).iter_rows()] == [
        None,
        "prompt is missing",
        "prompt is empty",
    ]
