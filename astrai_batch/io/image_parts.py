"""A row's images as the row names them: OpenAI ``image_url`` content parts and
``--image-column`` cells, read into `ImageRef`s (nothing is fetched or decoded here).

In a message, each image part becomes ``{"type": "image"}`` where it stood (the part
transformers' chat templates and processors place an image's tokens for) and its `ImageRef`
joins the row's `images`, in the order the row names them. Row error messages
(``where`` is e.g. ``body.messages[0]``, ``content[n]`` the part's position):

- ``{where} content[1] image_url must be an object with a url, or a string, got integer``
- ``{where} content[1] image_url has no url``, ``... image_url.url must be a string, got list``,
  ``... image_url.url is empty``
- ``{where} content[1] image_url.detail must be auto, low or high, got 'medium'``
- ``{where} has an image_url content part in a system message; images go in user messages``
- ``{column} must be image bytes, a path, URI or data URL, a {bytes, path} struct, or a list
  of those, got integer`` (and ``{column}[2] ...`` for a list's item)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.io.image_cells import CellOrigin
from astrai_batch.io.image_sources import DETAILS, ImageRef
from astrai_batch.io.rows import RowProblem
from astrai_batch.json_types import json_type

IMAGE_PART_TYPE = "image_url"
IMAGE_PLACEHOLDER = {"type": "image"}  # what a chat template reads for one image
# Roles whose messages may hold images (OpenAI's: only a user message takes image parts).
IMAGE_ROLES = ("user",)
CELL_EXPECTATION = (
    "image bytes, a path, URI or data URL, a {bytes, path} struct, or a list of those"
)


def image_part_ref(part: Mapping[str, Any], where: str) -> ImageRef:
    """The `ImageRef` of one ``{"type": "image_url", "image_url": ...}`` content part, where
    ``image_url`` is ``{"url": ..., "detail": ...}`` (OpenAI) or the URL string itself."""
    value = part.get("image_url")
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise RowProblem(
            f"{where} image_url must be an object with a url, or a string, got {json_type(value)}"
        )
    url = value.get("url")
    if url is None:
        raise RowProblem(f"{where} image_url has no url")
    if not isinstance(url, str):
        raise RowProblem(f"{where} image_url.url must be a string, got {json_type(url)}")
    if not url.strip():
        raise RowProblem(f"{where} image_url.url is empty")
    detail = value.get("detail")
    if detail is not None and detail not in DETAILS:
        shown = repr(detail) if isinstance(detail, str) else json_type(detail)
        raise RowProblem(f"{where} image_url.detail must be auto, low or high, got {shown}")
    return ImageRef(url=url, detail=detail)


def check_image_role(role: str, where: str) -> None:
    if role not in IMAGE_ROLES:
        raise RowProblem(
            f"{where} has an image_url content part in a {role} message; images go in user messages"
        )


def image_cell_refs(
    value: Any, column: str, origin: CellOrigin | None = None
) -> tuple[ImageRef, ...]:
    """The images of one ``--image-column`` cell: null or an empty list is none; bytes; a
    string (a path, URI or data URL); Hugging Face ``datasets``' Image struct
    ``{bytes, path}`` (bytes win; a struct with neither is no image); or a list of those.
    `origin`: where the record is stored (Parquet and Arrow inputs): its bytes are then
    named by their `ImageCell`, not kept (`io.image_cells` reads them when needed)."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        refs = []
        for position, item in enumerate(value):
            ref = _cell_ref(item, f"{column}[{position}]", origin, column, position)
            if ref is not None:
                refs.append(ref)
        return tuple(refs)
    ref = _cell_ref(value, column, origin, column, None)
    return () if ref is None else (ref,)


def _bytes_ref(
    data: Any, origin: CellOrigin | None, column: str, item: int | None, path: str | None = None
) -> ImageRef:
    if origin is None:
        return ImageRef(data=bytes(data), path_hint=path)
    return ImageRef(cell=origin.cell(column, item, len(data)), path_hint=path)


def _cell_ref(
    value: Any, where: str, origin: CellOrigin | None, column: str, item: int | None
) -> ImageRef | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_ref(value, origin, column, item)
    if isinstance(value, str):
        if not value.strip():
            raise RowProblem(f"{where} is an empty string, not an image")
        return ImageRef(url=value)
    if isinstance(value, Mapping) and set(value) <= {"bytes", "path"} and value:
        data, path = value.get("bytes"), value.get("path")
        if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
            raise RowProblem(f"{where}.bytes must be binary, got {json_type(data)}")
        if path is not None and not isinstance(path, str):
            raise RowProblem(f"{where}.path must be a string, got {json_type(path)}")
        if data is not None:
            return _bytes_ref(data, origin, column, item, path or None)
        if path:
            return ImageRef(url=path)
        return None
    if value is None:
        return None
    raise RowProblem(f"{where} must be {CELL_EXPECTATION}, got {json_type(value)}")


def images_first(text: str, count: int) -> list[dict[str, Any]]:
    """A user message's content with `count` images before its text, as Hugging Face's VLM
    examples write it."""
    return [*(dict(IMAGE_PLACEHOLDER) for _ in range(count)), {"type": "text", "text": text}]


def with_column_images(
    shape: str, content: dict[str, Any], images: tuple[ImageRef, ...], column: str
) -> dict[str, Any]:
    """A plain row's InputRow keywords with its ``--image-column`` images: a prompt becomes
    one user message, the images before the text (a row without images too, so every row of
    the job meets the same chat template); a messages row gets them before the content of
    its first user message."""
    if shape == "prompt":
        text = content["prompt"]
        body: Any = images_first(text, len(images)) if images else text
        return {"messages": ({"role": "user", "content": body},), "images": images}
    if not images:
        return content
    if shape == "prompt_token_ids":
        raise RowProblem(
            f"a prompt_token_ids row cannot take images from {column} (an image's tokens come "
            "from the model's processor); give a prompt or messages"
        )
    if content.get("images"):
        raise RowProblem(
            f"the row has images both in its messages and in {column}; give them in one place"
        )
    messages = [dict(message) for message in content["messages"]]
    first_user = next((m for m in messages if m["role"] in IMAGE_ROLES), None)
    if first_user is None:
        raise RowProblem(f"the row has images in {column} but no user message to hold them")
    text = first_user["content"]
    first_user["content"] = [
        *(dict(IMAGE_PLACEHOLDER) for _ in images),
        *(text if isinstance(text, list) else [{"type": "text", "text": text}]),
    ]
    return {"messages": tuple(messages), "images": images}
