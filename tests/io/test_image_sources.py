"""`io.image_sources`: every kind of image source decodes to the pixels transformers' own
`load_image` gives for the same data, and every bad image is an `ImageError` with an exact
one-line reason (random and truncated bytes included: never another exception, never a
silently different image)."""

from __future__ import annotations

import base64
import io
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astrai_batch.errors import ConfigError, ImageError
from astrai_batch.io.filesystems import resolve
from astrai_batch.io.image_cells import CellOrigin
from astrai_batch.io.image_sources import ImageLimits, ImageRef, load_image

Image = pytest.importorskip("PIL.Image")
transformers_image_utils = pytest.importorskip("transformers.image_utils")

FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF"}


def pattern(mode: str = "RGB", size: tuple[int, int] = (7, 5), seed: int = 0) -> Image.Image:
    """A small image whose every pixel differs (so a transposed or shifted decode shows)."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(array.squeeze(-1) if channels == 1 else array, mode)


def encoded(image: Image.Image, kind: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, FORMATS[kind], **options)
    return buffer.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image)


def reference(source: str) -> np.ndarray:
    """transformers' decoding of a data URL or a local path (code that is not ours)."""
    return pixels(transformers_image_utils.load_image(source))


def animated_gif() -> bytes:
    first, second = pattern(seed=1).convert("P"), pattern(seed=2).convert("P")
    return encoded(first, "gif", save_all=True, append_images=[second], duration=50)


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    return encoded(pattern(size=(8, 4)), "jpeg", exif=exif, quality=95)


CASES = {
    "png": lambda: encoded(pattern(), "png"),
    "png-rgba": lambda: encoded(pattern("RGBA"), "png"),
    "png-gray": lambda: encoded(pattern("L"), "png"),
    "png-palette": lambda: encoded(pattern().convert("P"), "png"),
    "jpeg": lambda: encoded(pattern(), "jpeg", quality=90),
    "jpeg-exif-rotated": rotated_jpeg,
    "webp": lambda: encoded(pattern(), "webp", lossless=True),
    "webp-lossy-rgba": lambda: encoded(pattern("RGBA"), "webp", quality=80),
    "gif-animated": animated_gif,
}
MEDIA = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "gif": "image/gif"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_data_urls_decode_to_transformers_pixels(case: str) -> None:
    data = CASES[case]()
    url = data_url(data, MEDIA[case.split("-")[0]])
    loaded = load_image(ImageRef(url=url, detail="low"))
    assert loaded.image.mode == "RGB"
    assert loaded.format == FORMATS[case.split("-")[0]]
    assert loaded.source == f"data URL ({MEDIA[case.split('-')[0]]}, {len(url):,} characters)"
    assert np.array_equal(pixels(loaded.image), reference(url))
    # the same bytes as a Parquet cell decode the same
    from_bytes = load_image(ImageRef(data=data))
    assert np.array_equal(pixels(from_bytes.image), pixels(loaded.image))


def test_exif_orientation_is_applied_as_transformers_does() -> None:
    loaded = load_image(ImageRef(data=rotated_jpeg()))
    assert loaded.size == (4, 8)  # stored 8x4, displayed turned a quarter


def test_an_animated_gif_gives_its_first_frame() -> None:
    loaded = load_image(ImageRef(data=animated_gif()))
    first = Image.open(io.BytesIO(animated_gif())).convert("RGB")
    assert np.array_equal(pixels(loaded.image), pixels(first))
    assert loaded.size == (7, 5)


def test_local_paths_and_file_uris(tmp_path, monkeypatch) -> None:
    path = tmp_path / "photo one.png"
    path.write_bytes(encoded(pattern(), "png"))
    expected = reference(str(path))
    monkeypatch.chdir(tmp_path)
    for url in (str(path), "photo one.png", path.as_uri()):
        loaded = load_image(ImageRef(url=url))
        assert np.array_equal(pixels(loaded.image), expected), url
    assert load_image(ImageRef(url="photo one.png")).source == "photo one.png"


def test_s3_uris_read_through_the_filesystems(s3_bucket, tmp_path) -> None:
    path = tmp_path / "cat.webp"
    path.write_bytes(encoded(pattern(), "webp", lossless=True))
    uri = s3_bucket.upload(path, "images/cat.webp")
    loaded = load_image(ImageRef(url=uri))
    assert loaded.source == "s3://bucket/images/cat.webp"  # no credentials in messages
    assert np.array_equal(pixels(loaded.image), reference(str(path)))
    with pytest.raises(ImageError) as missing:
        load_image(ImageRef(url=s3_bucket.uri("images/dog.webp")))
    assert str(missing.value) == "image s3://bucket/images/dog.webp not found"


PNG = encoded(pattern(), "png")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (ImageRef(data=b""), "image (0 bytes) is empty"),
        (
            ImageRef(data=b"not an image at all", path_hint="a.png"),
            "image a.png (19 bytes) is not an image Pillow can decode (unknown or corrupt header)",
        ),
        (
            ImageRef(data=PNG[:60]),
            "image (60 bytes) is truncated: image file is truncated",
        ),
        (
            ImageRef(data=b"%PDF-1.7\n..."),
            "image (12 bytes) is a PDF document, not a supported image format (PNG, JPEG, "
            "WebP, GIF, BMP, TIFF, ...)",
        ),
        (
            ImageRef(data=b'<svg xmlns="http://www.w3.org/2000/svg"/>'),
            "image (41 bytes) is an SVG drawing, not a supported image format (PNG, JPEG, "
            "WebP, GIF, BMP, TIFF, ...)",
        ),
        (
            ImageRef(data=b"\0\0\0\x18ftypheic\0\0\0\0mif1heic"),
            "image (24 bytes) is a HEIC/HEIF image, not a supported image format (PNG, JPEG, "
            "WebP, GIF, BMP, TIFF, ...)",
        ),
        (
            ImageRef(url="data:image/png,rawtext"),
            "image data URL (image/png, 22 characters): the data URL is not base64 (write "
            "data:image/png;base64,...)",
        ),
        (
            ImageRef(url="data:image/png;base64"),
            "image data URL (image/png, 21 characters): a data URL needs a comma before its data",
        ),
        (
            ImageRef(url="data:text/plain;base64,aGVsbG8="),
            "image data URL (text/plain, 31 characters): media type text/plain is not an image",
        ),
        (
            ImageRef(url="data:image/png;base64,iVBO*w0KGgo="),
            "image data URL (image/png, 34 characters): the data URL's base64 is invalid: "
            "Only base64 data is allowed",
        ),
        (
            ImageRef(url="data:image/png;base64,aGVsbG8="),
            "image data URL (image/png, 30 characters) is not an image Pillow can decode "
            "(unknown or corrupt header)",
        ),
        (
            ImageRef(url="https://example.com/cat.png"),
            "image https://example.com/cat.png: http(s) URLs are not fetched by a batch job; "
            "store the image and name its path, an s3:// / gs:// URI, or a data URL",
        ),
        (ImageRef(url="/no/such/dir/cat.png"), "image /no/such/dir/cat.png not found"),
        (
            ImageRef(url="nosuchscheme://bucket/cat.png"),
            "image nosuchscheme://bucket/cat.png: cannot open nosuchscheme://bucket/cat.png: "
            "Unrecognized filesystem type in URI: nosuchscheme://bucket/cat.png",
        ),
    ],
    ids=lambda value: value.source if isinstance(value, ImageRef) else "",
)
def test_bad_images_have_one_line_reasons(ref: ImageRef, message: str) -> None:
    with pytest.raises(ImageError) as error:
        load_image(ref)
    assert str(error.value) == message


def test_a_directory_is_no_image(tmp_path) -> None:
    with pytest.raises(ImageError) as error:
        load_image(ImageRef(url=str(tmp_path)))
    assert str(error.value) == f"image {tmp_path} is a directory, not a file"


def test_limits_are_checked_before_decoding() -> None:
    wide = encoded(Image.new("RGB", (1500, 1000)), "png")
    with pytest.raises(ImageError) as error:
        load_image(ImageRef(data=wide), ImageLimits(max_pixels=1_000_000))
    assert str(error.value) == (
        f"image ({len(wide):,} bytes) has more pixels (1500x1000 = 1,500,000) than "
        "--max-image-pixels 1,000,000"
    )
    assert load_image(ImageRef(data=wide), ImageLimits(max_pixels=1_500_000)).size == (1500, 1000)
    # a header claiming far more than Pillow's own guard: refused without expanding it
    bomb = bytearray(encoded(Image.new("L", (1, 1)), "png"))
    bomb[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR width and height
    bomb[29:33] = zlib.crc32(bytes(bomb[12:29])).to_bytes(4, "big")
    with pytest.raises(ImageError) as error:
        load_image(ImageRef(data=bytes(bomb)))
    assert "than --max-image-pixels 50,000,000" in str(error.value)
    with pytest.raises(ImageError) as error:
        load_image(ImageRef(data=PNG), ImageLimits(max_bytes=10))
    assert (
        str(error.value)
        == f"image ({len(PNG):,} bytes) is {len(PNG):,} bytes, more than the limit of 10 bytes"
    )


def test_limits_and_refs_are_validated() -> None:
    assert ImageLimits() == ImageLimits(50_000_000, 16, 64 * 2**20)
    for bad in ({"max_pixels": 0}, {"max_images_per_row": True}, {"max_bytes": 1.5}):
        with pytest.raises(ConfigError):
            ImageLimits(**bad)
    cell = CellOrigin(resolve("in.parquet"), "parquet", 0, 0).cell("img", None, 1)
    for fields in ({}, {"url": "a.png", "data": b"x"}, {"data": b"x", "cell": cell}):
        with pytest.raises(ValueError, match=r"^an ImageRef has exactly one of url, data, cell a"):
            ImageRef(**fields)
    with pytest.raises(ValueError, match="detail must be one of"):
        ImageRef(url="a.png", detail="medium")
    # messages and reprs never carry a data URL's bytes
    assert repr(ImageRef(url=data_url(PNG))) == (
        f"ImageRef('data URL (image/png, {len(data_url(PNG)):,} characters)', detail=None)"
    )


def test_missing_pillow_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ConfigError) as error:
        load_image(ImageRef(data=PNG))
    assert str(error.value) == "rows with images need Pillow: pip install 'astrai-batch[vision]'"


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        loaded = load_image(ImageRef(data=data))
    except ImageError as error:
        assert "\n" not in str(error)
    else:
        assert loaded.image.mode == "RGB"


VALID = {name: make() for name, make in CASES.items()}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(VALID)), st.data())
def test_damaged_images_are_errors_or_the_whole_image(name: str, data) -> None:
    """A truncated or bit-flipped image is an `ImageError`, or decodes to exactly the
    intact image's pixels (an unneeded trailer lost): never another exception."""
    whole = VALID[name]
    damaged = bytearray(whole[: data.draw(st.integers(0, len(whole) - 1), label="cut")])
    if damaged and data.draw(st.booleans(), label="flip"):
        at = data.draw(st.integers(0, len(damaged) - 1), label="at")
        damaged[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    try:
        loaded = load_image(ImageRef(data=bytes(damaged)))
    except ImageError as error:
        assert "\n" not in str(error)
        return
    assert loaded.image.mode == "RGB"
    if len(damaged) == len(whole[: len(damaged)]) and bytes(damaged) == whole[: len(damaged)]:
        intact = load_image(ImageRef(data=whole))
        assert np.array_equal(pixels(loaded.image), pixels(intact.image))
