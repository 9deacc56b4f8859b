"""A JSON Lines row's large data URLs kept as their place in the file (`io.data_url_spans`):
the row holds a span, not the base64 text, and reading the span gives the same pixels as
the URL; short URLs, gzip files and escaped URLs keep the text; a changed or vanished file
fails the image with a one-line reason; a read from the middle of the file takes the same
spans; a file on S3 reads its spans by range."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from vision_kit import png_data_url, random_image

from astrai_batch.errors import ImageError
from astrai_batch.io import open_input
from astrai_batch.io.data_url_spans import MIN_SPAN_CHARS
from astrai_batch.io.image_sources import ImageRef, load_image

pytest.importorskip("PIL.Image")
CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, *urls: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content = [*parts, {"type": "text", "text": "What is this?"}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def big_url(seed: int) -> str:
    url = png_data_url(random_image(seed, (48, 48)))  # random pixels: ~9 KB of base64
    assert len(url) > MIN_SPAN_CHARS
    return url


def small_url() -> str:
    url = png_data_url(random_image(0, (2, 2)))
    assert len(url) < MIN_SPAN_CHARS
    return url


def pixels(ref: ImageRef) -> bytes:
    return load_image(ref).image.tobytes()


def test_large_data_urls_are_spans_that_read_the_same_pixels(write_jsonl) -> None:
    urls = [big_url(1), big_url(2), big_url(3)]
    lines = [chat_line("a", urls[0], small_url()), chat_line("b", urls[1], urls[2])]
    path = write_jsonl("batch.jsonl", lines)
    rows = list(open_input(path).iter_rows())
    refs = [ref for row in rows for ref in row.images]
    assert [ref.url is None for ref in refs] == [True, False, True, True]
    assert refs[1].url == small_url()
    assert [ref.span.length for ref in (refs[0], refs[2], refs[3])] == [len(u) for u in urls]
    assert refs[0].source == f"data URL (image/png, {len(urls[0]):,} characters)"
    data = path.read_bytes()
    for ref, url in zip((refs[0], refs[2], refs[3]), urls, strict=True):
        assert data[ref.span.start : ref.span.start + ref.span.length] == url.encode()
        assert pixels(ref) == pixels(ImageRef(url=url))
    # a waiting row weighs its text, not its images
    assert len(pickle.dumps(rows[1])) < 2_000 < len(urls[1])
    # a read from the second row on names the same spans
    (again,) = open_input(path).iter_rows(start=1)
    assert again.images == rows[1].images


def test_gzip_files_and_escaped_urls_keep_the_url_text(write_jsonl) -> None:
    url = big_url(4)
    (zipped,) = open_input(
        write_jsonl("batch.jsonl.gz", [chat_line("a", url)], compress=True)
    ).iter_rows()
    assert zipped.images[0].url == url
    escaped = json.dumps(chat_line("a", url)).replace("/", "\\/")  # as PHP's json_encode
    (row,) = open_input(write_jsonl("escaped.jsonl", [escaped])).iter_rows()
    assert row.images[0].url == url
    assert pixels(row.images[0]) == pixels(ImageRef(url=url))


def test_a_changed_or_vanished_file_fails_the_image_in_one_line(write_jsonl) -> None:
    url = big_url(5)
    path = write_jsonl("batch.jsonl", [chat_line("a", url), chat_line("b", big_url(6))])
    first, second = (row.images[0] for row in open_input(path).iter_rows())
    data = bytearray(path.read_bytes())
    middle = second.span.start + second.span.length // 2
    data[middle] = ord("A") if data[middle] != ord("A") else ord("B")  # base64 still
    path.write_bytes(bytes(data))
    assert pixels(first) == pixels(ImageRef(url=url))  # the other image still reads
    with pytest.raises(ImageError) as changed:
        load_image(second)
    shown = f"data URL (image/png, {second.span.length:,} characters)"
    assert str(changed.value) == f"image {shown} changed after the job first read it"
    path.write_bytes(bytes(data[: first.span.start + 10]))  # truncated inside the first URL
    with pytest.raises(ImageError, match=r"^image data URL \(image/png, .*\) changed after"):
        load_image(first)
    path.unlink()
    with pytest.raises(ImageError) as gone:
        load_image(first)
    assert str(gone.value) == f"{path} is gone: its images cannot be read again"


def test_a_jsonl_file_on_s3_reads_its_spans_by_range(s3_bucket, write_jsonl) -> None:
    urls = [big_url(7), big_url(8)]
    path: Path = write_jsonl("batch.jsonl", [chat_line("a", urls[0]), chat_line("b", urls[1])])
    uri = s3_bucket.upload(path, "spans/batch.jsonl")
    refs = [row.images[0] for row in open_input(uri).iter_rows()]
    assert all(ref.span is not None for ref in refs)
    assert [pixels(ref) for ref in refs] == [pixels(ImageRef(url=url)) for url in urls]
