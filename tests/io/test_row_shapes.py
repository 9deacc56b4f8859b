"""Each row is read by its own shape, whatever the rows before it were."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from astrai_batch.io import InputRow, open_input

HI = [{"role": "user", "content": "Hi"}]


def test_a_jsonl_file_of_every_shape(write_jsonl) -> None:
    path = write_jsonl(
        "mixed.jsonl",
        [
            {"id": "p", "prompt": "Once", "temperature": 0.5},
            {"id": "m", "messages": HI, "stop": ["x"]},
            {"id": "t", "prompt_token_ids": [3, 1, 4]},
            {
                "custom_id": "o",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": "Upon", "max_tokens": 3},
            },
            {"custom_id": "c", "body": {"messages": HI}},
        ],
    )
    source = open_input(path)
    assert source.shape == "mixed"
    assert source.columns() == [
        "id",
        "prompt",
        "temperature",
        "messages",
        "stop",
        "prompt_token_ids",
        "custom_id",
        "method",
        "url",
        "body",
    ]
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="p", prompt="Once", overrides={"temperature": 0.5}),
        InputRow(index=1, id="m", messages=tuple(HI), overrides={"stop": ["x"]}),
        InputRow(index=2, id="t", prompt_token_ids=(3, 1, 4)),
        InputRow(index=3, id="o", prompt="Upon", overrides={"max_tokens": 3}, custom_id="o"),
        InputRow(index=4, id="c", messages=tuple(HI), custom_id="c"),
    ]


def test_a_messages_row_after_a_prompt_row(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [{"prompt": "a"}, {"messages": HI}, {"messages": "not a list"}, {"prompt": None}],
    )
    assert list(open_input(path).iter_rows()) == [
        InputRow(index=0, id="0", prompt="a"),
        InputRow(index=1, id="1", messages=tuple(HI)),
        InputRow(
            index=2,
            id="2",
            error="messages must be a list of {role, content} objects, got string",
        ),
        InputRow(index=3, id="3", error="prompt is missing"),
    ]


def test_shape_of_a_single_shape_file_and_a_row_with_no_prompt_field(write_jsonl) -> None:
    path = write_jsonl("in.jsonl", [{"messages": HI}, {"text": "x"}])
    source = open_input(path)
    assert source.shape == "messages"
    assert [row.error for row in source.iter_rows()] == [
        None,
        "row has no prompt, messages, prompt_token_ids or body",
    ]


def test_a_body_column_without_custom_id_is_data_not_a_request(tmp_path: Path) -> None:
    path = tmp_path / "mail.parquet"
    pq.write_table(pa.table({"prompt": ["Reply:", None], "body": ["Dear Ann", "Dear Bob"]}), path)
    source = open_input(path)
    assert source.shape == "prompt"
    assert [(row.prompt, row.error) for row in source.iter_rows()] == [
        ("Reply:", None),
        (None, "prompt is missing"),
    ]


def test_parquet_requests_beside_prompts(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "custom_id": ["r0", "r1"],
                "body": ['{"prompt": "From body"}', None],
                "prompt": [None, "From column"],
            }
        ),
        path,
    )
    source = open_input(path)
    assert source.shape == "mixed"
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="r0", prompt="From body", custom_id="r0"),
        InputRow(index=1, id="r1", prompt="From column", custom_id="r1"),
    ]


def test_per_row_stop_token_ids_ignore_eos_and_template_kwargs(write_jsonl) -> None:
    path = write_jsonl(
        "in.jsonl",
        [
            {
                "id": "m",
                "messages": HI,
                "stop_token_ids": [7, 9],
                "ignore_eos": True,
                "chat_template_kwargs": {"enable_thinking": False, "unset": None},
            },
            {"id": "p", "prompt": "p", "chat_template_kwargs": {"ignored": 1}},
            {
                "custom_id": "r",
                "body": {
                    "messages": HI,
                    "stop_token_ids": [2],
                    "ignore_eos": False,
                    "chat_template_kwargs": {"style": "terse"},
                },
            },
            {"id": "l", "messages": HI, "chat_template_kwargs": ["enable_thinking"]},
            {"custom_id": "s", "body": {"messages": HI, "chat_template_kwargs": "x"}},
        ],
    )
    rows = list(open_input(path).iter_rows())
    assert rows[0].overrides == {"stop_token_ids": [7, 9], "ignore_eos": True}
    # A null variable leaves the job-wide value in place, so it is not passed on.
    assert rows[0].chat_template_kwargs == {"enable_thinking": False}
    assert rows[1].chat_template_kwargs is None  # only a chat template reads them
    assert (rows[2].overrides, rows[2].chat_template_kwargs) == (
        {"stop_token_ids": [2], "ignore_eos": False},
        {"style": "terse"},
    )
    assert rows[3].error == "chat_template_kwargs must be an object, got list"
    assert rows[4].error == (
        "body.chat_template_kwargs is not valid JSON: Expecting value at column 1"
    )


def test_parquet_template_kwargs_as_struct_or_json_text(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    messages = [[{"role": "user", "content": "Hi"}]] * 3
    pq.write_table(
        pa.table(
            {
                "messages": messages,
                "chat_template_kwargs": [
                    {"enable_thinking": False},
                    {"enable_thinking": None},
                    None,
                ],
                "note": ['{"k": 1}', None, "{bad"],
            }
        ),
        path,
    )
    assert [row.chat_template_kwargs for row in open_input(path).iter_rows()] == [
        {"enable_thinking": False},
        {},
        None,
    ]
    as_text = tmp_path / "text.parquet"
    pq.write_table(
        pa.table({"messages": messages, "chat_template_kwargs": ['{"k": 1}', None, "{bad"]}),
        as_text,
    )
    assert [(row.chat_template_kwargs, row.error) for row in open_input(as_text).iter_rows()] == [
        ({"k": 1}, None),
        (None, None),
        (
            None,
            "chat_template_kwargs is not valid JSON: Expecting property name enclosed in "
            "double quotes at column 2",
        ),
    ]
