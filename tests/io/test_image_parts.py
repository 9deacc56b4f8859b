"""Images named by rows: OpenAI ``image_url`` content parts (chat lines and plain messages
rows, JSONL and Parquet) become the row's `ImageRef`s in order and ``{"type": "image"}``
parts of its messages; every malformed part is a row error with an exact reason."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.io import InputRow, open_input
from astrai_batch.io.image_sources import ImageRef

CHAT = "/v1/chat/completions"
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def chat_line(custom_id: str, messages: Any, url: str = CHAT, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "m", "messages": messages, **body},
    }


def user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def image(url: Any, detail: Any = None) -> dict[str, Any]:
    inner = {"url": url} if detail is None else {"url": url, "detail": detail}
    return {"type": "image_url", "image_url": inner}


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def rows_of(write_jsonl, lines: list[Any]) -> list[InputRow]:
    return list(open_input(write_jsonl("batch.jsonl", lines)).iter_rows())


def test_chat_lines_name_their_images_in_order(write_jsonl) -> None:
    messages = [
        {"role": "system", "content": "You describe images."},
        {
            "role": "user",
            "content": [
                text("Compare"),
                image(PNG_URL, "low"),
                text("with"),
                {"type": "image_url", "image_url": "s3://bucket/b.jpg"},  # the string form
            ],
        },
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": [image("photos/c.webp", "high"), text("And this?")]},
    ]
    (row,) = rows_of(write_jsonl, [chat_line("a", messages)])
    assert row.error is None
    assert row.images == (
        ImageRef(url=PNG_URL, detail="low"),
        ImageRef(url="s3://bucket/b.jpg"),
        ImageRef(url="photos/c.webp", detail="high"),
    )
    assert row.messages == (
        {"role": "system", "content": "You describe images."},
        {
            "role": "user",
            "content": [text("Compare"), {"type": "image"}, text("with"), {"type": "image"}],
        },
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": [{"type": "image"}, text("And this?")]},
    )


def test_text_only_content_parts_stay_one_string(write_jsonl) -> None:
    (row,) = rows_of(write_jsonl, [chat_line("a", user(text("one"), text("two")))])
    assert row.messages == ({"role": "user", "content": "one\ntwo"},)
    assert row.images == ()


def test_plain_messages_rows_take_image_parts_too(write_jsonl, tmp_path) -> None:
    messages = user(image("cat.png"), text("What is this?"))
    (from_jsonl,) = rows_of(write_jsonl, [{"id": "x", "messages": messages}])
    # Parquet stores parts as structs: every part has every field, absent ones null
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["x"], "messages": [messages]}), path)
    (from_parquet,) = open_input(path).iter_rows()
    for row in (from_jsonl, from_parquet):
        assert row.images == (ImageRef(url="cat.png"),)
        assert row.messages == (
            {"role": "user", "content": [{"type": "image"}, text("What is this?")]},
        )


WHERE = "body.messages[0]"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (user({"type": "image_url"}), f"{WHERE} content[0] image_url must be an object with a "
         "url, or a string, got null"),
        (user({"type": "image_url", "image_url": 3}), f"{WHERE} content[0] image_url must be an "
         "object with a url, or a string, got integer"),
        (user(text("a"), {"type": "image_url", "image_url": {}}),
         f"{WHERE} content[1] image_url has no url"),
        (user(image(["a.png"])), f"{WHERE} content[0] image_url.url must be a string, got list"),
        (user(image(" ")), f"{WHERE} content[0] image_url.url is empty"),
        (user(image("a.png", "medium")),
         f"{WHERE} content[0] image_url.detail must be auto, low or high, got 'medium'"),
        (user(image("a.png", 1)),
         f"{WHERE} content[0] image_url.detail must be auto, low or high, got integer"),
        ([{"role": "system", "content": [image("a.png")]}],
         f"{WHERE} has an image_url content part in a system message; images go in user "
         "messages"),
        (user({"type": "input_audio", "input_audio": {}}),
         f"{WHERE} has a input_audio content part; only text and image_url are supported"),
        (user("a.png"), f"{WHERE} content[0] must be a content part object, got string"),
    ],
)  # fmt: skip
def test_malformed_image_parts_are_row_errors(write_jsonl, messages, message) -> None:
    rows = rows_of(write_jsonl, [chat_line("ok", user(text("hi"))), chat_line("bad", messages)])
    assert rows[0].error is None
    assert (rows[1].id, rows[1].error, rows[1].images) == ("bad", message, ())


def test_an_assistant_message_with_tool_calls_takes_no_images(write_jsonl) -> None:
    messages = [
        *user(text("hi")),
        {
            "role": "assistant",
            "content": [image("a.png")],
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]
    (row,) = rows_of(write_jsonl, [chat_line("a", messages)])
    assert row.error == ("body.messages[1] has a image_url content part; only text is supported")


def test_images_in_a_completions_prompt_are_refused(write_jsonl) -> None:
    line = {
        "custom_id": "c",
        "url": "/v1/completions",
        "body": {"model": "m", "prompt": [image("a.png")]},
    }
    (row,) = rows_of(write_jsonl, [line])
    assert row.error == (
        "body.prompt of /v1/completions is text or token ids; content parts such as images "
        "go in /v1/chat/completions messages"
    )
