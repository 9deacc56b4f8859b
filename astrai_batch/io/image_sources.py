"""Where a row's images come from, and turning one into pixels (or a row error).

Readers keep only `ImageRef`s (a URL or path as the row names it, or where a Parquet cell
stores its bytes, `io.image_cells`); the job decodes each row's images with `load_image` when
it prepares the row's window and again when the row's request enters the engine, so no
waiting row holds decoded images or a cell's bytes.
An image that cannot be used raises `ImageError` with a one-line reason, which the job turns
into that row's error.

A `url` is one of: a ``data:`` URL (``data:image/png;base64,...``), a local path (relative to
the working directory, as transformers' ``load_image`` reads it), or a URI of any filesystem
pyarrow opens (``file://``, ``s3://``, ``gs://``, ``hdfs://``), read through
`io.filesystems` with the same credentials as the input. ``http(s)://`` URLs are not fetched:
a batch job reads stored data (download the images, or put them on an object store).

Decoding follows ``transformers.image_utils.load_image``: EXIF orientation applied
(``ImageOps.exif_transpose``), then ``convert("RGB")`` (an alpha channel is dropped, not
composited; a palette is expanded); an animated GIF or WebP gives its first frame. The pixel
limit is checked from the header before anything is decoded, so a decompression bomb is
refused without being expanded.

Pillow is the ``vision`` extra (``pip install 'astrai-batch[vision]'``), imported only here
and only when an image is loaded.
"""

from __future__ import annotations

import base64
import binascii
import warnings
from dataclasses import dataclass
from io import BytesIO
from typing import Any
from urllib.parse import unquote_to_bytes

import pyarrow as pa

from astrai_batch.checks import require_positive_int
from astrai_batch.errors import ConfigError, ImageError
from astrai_batch.io.data_url_spans import DataUrlSpan, read_data_url
from astrai_batch.io.filesystems import is_uri, resolve, shown_uri
from astrai_batch.io.image_cells import CellReader, ImageCell

__all__ = [
    "DETAILS",
    "ImageError",
    "ImageLimits",
    "ImageRef",
    "LoadedImage",
    "check_image_count",
    "load_image",
    "require_pillow",
    "too_many_images_message",
]

DETAILS = ("auto", "low", "high")  # OpenAI's image_url.detail values
VISION_EXTRA_HINT = "pip install 'astrai-batch[vision]'"

DEFAULT_MAX_PIXELS = 50_000_000  # width x height; below PIL's own bomb guard (89.5M)
DEFAULT_MAX_IMAGES_PER_ROW = 16
DEFAULT_MAX_BYTES = 64 * 2**20  # one image's stored (encoded) size

_SHOWN_URL = 60  # the longest path or URI a message repeats in full


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a row, as the row names it: exactly one of `url` (a data URL, a local
    path or a filesystem URI), `data` (encoded bytes), `cell` (where a Parquet or Arrow
    cell stores them: the readers keep that, not the bytes, `io.image_cells`) and `span`
    (where a JSONL line stores a large data URL, `io.data_url_spans`). `detail` is
    OpenAI's ``auto`` / ``low`` / ``high`` (None: not given); `path_hint` names bytes in
    messages (Hugging Face's Image struct stores the file name beside them)."""

    url: str | None = None
    data: bytes | None = None
    detail: str | None = None
    path_hint: str | None = None
    cell: ImageCell | None = None
    span: DataUrlSpan | None = None

    def __post_init__(self) -> None:
        given = (self.url, self.data, self.cell, self.span)
        if sum(value is not None for value in given) != 1:
            raise ValueError("an ImageRef has exactly one of url, data, cell and span")
        if self.url is not None and (not isinstance(self.url, str) or not self.url):
            raise ValueError("ImageRef.url must be a non-empty string")
        if self.data is not None and not isinstance(self.data, bytes):
            raise ValueError("ImageRef.data must be bytes")
        if self.detail is not None and self.detail not in DETAILS:
            raise ValueError(f"ImageRef.detail must be one of {DETAILS}, got {self.detail!r}")

    @property
    def source(self) -> str:
        """How messages name this image: short, never the bytes of a data URL."""
        if self.span is not None:
            return self.span.shown
        if self.url is None:
            named = f"{_shorten(self.path_hint)} " if self.path_hint else ""
            size = self.cell.size if self.cell is not None else len(self.data or b"")
            return f"{named}({size:,} bytes)"
        url = self.url or ""
        if url[:5].lower() == "data:":
            media = url[5:].split(",", 1)[0].split(";", 1)[0] or "no media type"
            return f"data URL ({media}, {len(url):,} characters)"
        return _shorten(shown_uri(url) if is_uri(url) else url)

    def __repr__(self) -> str:  # never print an image's bytes or a whole data URL
        return f"ImageRef({self.source!r}, detail={self.detail!r})"


@dataclass(frozen=True)
class ImageLimits:
    """What a job accepts: `max_pixels` (width x height of one image, checked before
    decoding; ``--max-image-pixels``), `max_images_per_row` (``--max-images-per-row``),
    `max_bytes` (one image's encoded size)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        require_positive_int("max_image_pixels", self.max_pixels)
        require_positive_int("max_images_per_row", self.max_images_per_row)
        require_positive_int("max_image_bytes", self.max_bytes)


@dataclass(frozen=True)
class LoadedImage:
    """A decoded image: `image` is an RGB ``PIL.Image.Image``; `source` names it in
    messages; `format` is what Pillow read (``PNG``, ``JPEG``, ``WEBP``, ``GIF``, ...)."""

    image: Any
    source: str
    format: str

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def require_pillow() -> Any:
    """The ``PIL.Image`` module; without Pillow, one `ConfigError` naming the extra (a
    job-wide problem, never a row's)."""
    try:
        from PIL import Image, ImageOps  # noqa: F401  (ImageOps: loaded for exif_transpose)
    except ImportError as exc:
        raise ConfigError(f"rows with images need Pillow: {VISION_EXTRA_HINT}") from exc
    return Image


def check_image_count(count: int, limits: ImageLimits) -> None:
    """Raise `ImageError` when a row holds more images than the job allows."""
    if count > limits.max_images_per_row:
        raise ImageError(too_many_images_message(count, limits.max_images_per_row))


def too_many_images_message(count: int, limit: int) -> str:
    return f"the row has {count} images, more than --max-images-per-row {limit}"


def load_image(
    ref: ImageRef, limits: ImageLimits | None = None, cells: CellReader | None = None
) -> LoadedImage:
    """The decoded RGB image of `ref` (see the module docstring for the rules); raises
    `ImageError` with a one-line reason for anything that keeps it from being used. A `cell`
    is read through `cells` (a reader that keeps no row group when None)."""
    limits = limits or ImageLimits()
    image_module = require_pillow()
    source = ref.source
    if ref.data is not None:
        data = ref.data
    elif ref.cell is not None:
        data = (cells or CellReader(keep=0)).read(ref.cell)
    elif ref.span is not None:
        data = _data_url_bytes(read_data_url(ref.span), source)
    else:
        data = _read_url(ref.url or "", source, limits)
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"image {source} is {len(data):,} bytes, more than the limit of "
            f"{limits.max_bytes:,} bytes"
        )
    image, image_format = _decode(image_module, data, source, limits)
    return LoadedImage(image=image, source=source, format=image_format)


def _read_url(url: str, source: str, limits: ImageLimits) -> bytes:
    if url[:5].lower() == "data:":
        return _data_url_bytes(url, source)
    scheme = url.split("://", 1)[0].lower() if is_uri(url) else ""
    if scheme in ("http", "https"):
        raise ImageError(
            f"image {source}: http(s) URLs are not fetched by a batch job; store the image "
            "and name its path, an s3:// / gs:// URI, or a data URL"
        )
    try:
        location = resolve(url, ImageError)
        with location.open_input_stream() as stream:
            data = stream.read(limits.max_bytes + 1)
    except ImageError as exc:  # the URI itself: a scheme pyarrow has no filesystem for
        raise ImageError(f"image {source}: {exc}") from None
    except FileNotFoundError:
        raise ImageError(f"image {source} not found") from None
    except IsADirectoryError:
        raise ImageError(f"image {source} is a directory, not a file") from None
    except (OSError, pa.ArrowException) as exc:
        if "is a directory" in str(exc):  # pyarrow's local filesystem says it in words
            raise ImageError(f"image {source} is a directory, not a file") from None
        raise ImageError(f"image {source} cannot be read: {_one_line(exc)}") from None
    return bytes(data)


def _data_url_bytes(url: str, source: str) -> bytes:
    """The bytes of ``data:[<media type>][;base64],<data>``; only base64 holds an image."""
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise ImageError(f"image {source}: a data URL needs a comma before its data")
    params = [part.strip().lower() for part in head.split(";")]
    media = params[0]
    if media and not media.startswith("image/"):
        raise ImageError(f"image {source}: media type {media} is not an image")
    if "base64" not in params[1:]:
        raise ImageError(
            f"image {source}: the data URL is not base64 (write data:image/png;base64,...)"
        )
    try:
        # strict: a stray character is an error, not silently skipped bytes; %-escapes and
        # line breaks (allowed in URLs) are undone first
        text = unquote_to_bytes(payload) if "%" in payload else payload.encode("ascii")
        if any(space in text for space in _URL_SPACES):
            text = text.translate(None, b"".join(_URL_SPACES))
        return _strict_base64(text)
    except UnicodeEncodeError:
        raise ImageError(
            f"image {source}: the data URL's base64 is invalid: non-ASCII text"
        ) from None
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image {source}: the data URL's base64 is invalid: {exc}") from None


_URL_SPACES = (b" ", b"\t", b"\r", b"\n")


def _strict_base64(text: bytes) -> bytes:
    """Base64 that refuses any stray character; binascii's strict mode (Python 3.11+) is
    about three times as fast as ``b64decode(validate=True)``'s pattern check."""
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except TypeError:  # Python 3.10: no strict_mode
        return base64.b64decode(text, validate=True)


# Formats Pillow cannot read whose magic bytes are easy to tell: a clearer reason than
# "cannot identify image file".
_KNOWN_UNREADABLE = (
    (b"%PDF", "a PDF document"),
    (b"<svg", "an SVG drawing"),
    (b"<?xml", "an XML document (SVG?)"),
)
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")


def _unsupported_kind(data: bytes) -> str | None:
    head = data[:64].lstrip()
    for magic, kind in _KNOWN_UNREADABLE:
        if head.startswith(magic):
            return kind
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        return "a HEIC/HEIF image"
    return None


def _decode(image_module: Any, data: bytes, source: str, limits: ImageLimits) -> tuple[Any, str]:
    from PIL import ImageOps

    if not data:
        raise ImageError(f"image {source} is empty")
    unsupported = _unsupported_kind(data)
    if unsupported is not None:
        raise ImageError(
            f"image {source} is {unsupported}, not a supported image format "
            "(PNG, JPEG, WebP, GIF, BMP, TIFF, ...)"
        )
    with warnings.catch_warnings():
        # our own limit decides; Pillow's bomb warning would only repeat it on stderr
        warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
        try:
            opened = image_module.open(BytesIO(data))
        except image_module.UnidentifiedImageError:
            raise ImageError(
                f"image {source} is not an image Pillow can decode (unknown or corrupt header)"
            ) from None
        except image_module.DecompressionBombError:
            raise _too_many_pixels(source, None, limits) from None
        except Exception as exc:  # Pillow's format plugins raise many kinds on bad bytes
            raise ImageError(f"image {source} cannot be decoded: {_one_line(exc)}") from None
        width, height = opened.size
        if width * height > limits.max_pixels:
            raise _too_many_pixels(source, (width, height), limits)
        image_format = opened.format or "unknown"
        try:
            image = ImageOps.exif_transpose(opened)  # a new, loaded image
            if image.mode != "RGB":  # convert of an RGB image would only copy it again
                image = image.convert("RGB")
        except Exception as exc:
            reason = _one_line(exc)
            if "truncated" in reason:
                raise ImageError(f"image {source} is truncated: {reason}") from None
            raise ImageError(f"image {source} cannot be decoded: {reason}") from None
    if image.width * image.height == 0:
        raise ImageError(f"image {source} has no pixels ({image.width}x{image.height})")
    return image, image_format


def _too_many_pixels(source: str, size: tuple[int, int] | None, limits: ImageLimits) -> ImageError:
    shown = f" ({size[0]}x{size[1]} = {size[0] * size[1]:,})" if size else ""
    return ImageError(
        f"image {source} has more pixels{shown} than --max-image-pixels {limits.max_pixels:,}"
    )


def _shorten(text: str) -> str:
    return text if len(text) <= _SHOWN_URL else f"...{text[-(_SHOWN_URL - 3) :]}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
