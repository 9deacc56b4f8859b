"""``--image-column``: a Parquet or JSONL column of each row's images (bytes, strings, Hugging
Face's Image struct, lists of those) read into `ImageRef`s, placed before the prompt in one
user message; the reader decodes nothing. Bad cells, the per-row limit and unusable column
types are errors with exact messages."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import ConfigError, InputError
from astrai_batch.io import open_input
from astrai_batch.io.image_cells import CellReader
from astrai_batch.io.image_sources import ImageRef, load_image

Image = pytest.importorskip("PIL.Image")

IMAGE = {"type": "image"}


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), color).save(buffer, "PNG")
    return buffer.getvalue()


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def stored(ref: ImageRef) -> ImageRef:
    """A Parquet cell's image as its bytes (read from where the ref says they are)."""
    if ref.cell is None:
        return ref
    return dataclasses.replace(ref, data=CellReader().read(ref.cell), cell=None)


def where(ref: ImageRef) -> tuple | None:
    """(row group, row in it, column, list item, size) of a Parquet cell's image; None: a
    url."""
    cell = ref.cell
    if cell is None:
        return None
    return (cell.origin.row_group, cell.origin.row, cell.column, cell.item, cell.size)


def user(*parts) -> tuple[dict, ...]:
    return ({"role": "user", "content": list(parts)},)


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def test_hugging_face_image_structs_and_binary_cells(tmp_path) -> None:
    """As `datasets` writes its Image feature: {bytes, path} structs; null = no image."""
    table = pa.table(
        {
            "prompt": ["What color?", "And here?", "No image", "Path only"],
            "image": pa.array(
                [
                    {"bytes": RED, "path": "red.png"},
                    {"bytes": BLUE, "path": None},
                    None,
                    {"bytes": None, "path": "photos/cat.jpg"},
                ],
                HF_IMAGE,
            ),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    rows = list(open_input(tmp_path / "in.parquet", image_column="image").iter_rows())
    assert [row.error for row in rows] == [None] * 4
    # bytes are named by where they are stored (row group, row, column, list item), not kept
    assert [[where(ref) for ref in row.images] for row in rows] == [
        [(0, 0, "image", None, len(RED))],
        [(0, 1, "image", None, len(BLUE))],
        [],
        [None],
    ]
    assert [tuple(map(stored, row.images)) for row in rows] == [
        (ImageRef(data=RED, path_hint="red.png"),),
        (ImageRef(data=BLUE),),
        (),
        (ImageRef(url="photos/cat.jpg"),),
    ]
    assert rows[0].messages == user(IMAGE, text("What color?"))
    # a row without an image meets the same chat template, as a plain user message
    assert rows[2].messages == ({"role": "user", "content": "No image"},)
    # the bytes the cell names decode to the stored pixels
    assert np.asarray(load_image(rows[0].images[0]).image)[0, 0].tolist() == [255, 0, 0]
    assert rows[0].images[0].source == f"red.png ({len(RED):,} bytes)"


def test_lists_binary_and_string_cells(tmp_path) -> None:
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "prompt": ["Compare", "One", "None"],
            "images": pa.array([[RED, BLUE], [RED], []], pa.list_(pa.binary())),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    rows = list(open_input(tmp_path / "in.parquet", image_column="images").iter_rows())
    assert tuple(map(stored, rows[0].images)) == (ImageRef(data=RED), ImageRef(data=BLUE))
    assert [where(ref) for ref in rows[0].images] == [
        (0, 0, "images", 0, len(RED)),
        (0, 0, "images", 1, len(BLUE)),
    ]
    assert rows[0].messages == user(IMAGE, IMAGE, text("Compare"))
    assert rows[2].images == () and rows[2].messages == ({"role": "user", "content": "None"},)


def test_jsonl_cells_name_paths_and_data_urls(write_jsonl) -> None:
    lines = [
        {"prompt": "a", "img": "cat.png"},
        {"prompt": "b", "img": ["s3://bucket/x.png", "data:image/png;base64,AAAA"]},
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
         "img": {"path": "dog.png"}},
        {"prompt": "d", "img": None},
        {"prompt": "e", "img": 7},
        {"prompt_token_ids": [1, 2], "img": "cat.png"},
        {"prompt": "g", "img": ["a.png", ""]},
        {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "b.png"}}]}], "img": "a.png"},
        {"prompt": "i", "img": ["a.png"] * 3},
    ]  # fmt: skip
    source = open_input(write_jsonl("in.jsonl", lines), image_column="img", max_images_per_row=2)
    rows = list(source.iter_rows())
    assert rows[0].images == (ImageRef(url="cat.png"),)
    assert rows[1].images == (
        ImageRef(url="s3://bucket/x.png"),
        ImageRef(url="data:image/png;base64,AAAA"),
    )
    assert rows[2].messages == (
        {"role": "system", "content": "S"},
        {"role": "user", "content": [IMAGE, text("Q")]},
    )
    assert rows[3].error is None and rows[3].images == ()
    assert [row.error for row in rows[4:]] == [
        "img must be image bytes, a path, URI or data URL, a {bytes, path} struct, or a list "
        "of those, got integer",
        "a prompt_token_ids row cannot take images from img (an image's tokens come from the "
        "model's processor); give a prompt or messages",
        "img[1] is an empty string, not an image",
        "the row has images both in its messages and in img; give them in one place",
        "the row has 3 images, more than --max-images-per-row 2",
    ]


def test_the_per_row_limit_counts_image_url_parts_too(write_jsonl) -> None:
    part = {"type": "image_url", "image_url": {"url": "a.png"}}
    line = {"messages": [{"role": "user", "content": [part] * 17}]}
    (row,) = open_input(write_jsonl("in.jsonl", [line])).iter_rows()
    assert row.error == "the row has 17 images, more than --max-images-per-row 16"


def test_unusable_image_columns_are_refused_up_front(tmp_path, write_jsonl) -> None:
    pq.write_table(pa.table({"prompt": ["a"], "n": [1]}), tmp_path / "in.parquet")
    with pytest.raises(InputError) as error:
        open_input(tmp_path / "in.parquet", image_column="n")
    assert str(error.value) == (
        "image column 'n' in in.parquet has type int64; expected binary, a string, a "
        "{bytes, path} struct, or a list of those"
    )
    with pytest.raises(InputError) as error:
        open_input(tmp_path / "in.parquet", image_column="img")
    assert str(error.value) == (
        "image column 'img' not found in in.parquet; columns are: prompt, n"
    )
    with pytest.raises(InputError, match=r"image column 'img' not found in in\.jsonl"):
        open_input(write_jsonl("in.jsonl", [{"prompt": "a"}]), image_column="img")
    with pytest.raises(ConfigError) as error:
        open_input(tmp_path / "in.parquet", prompt_column="prompt", image_column="prompt")
    assert str(error.value) == "--image-column and --prompt-column both name 'prompt'"
