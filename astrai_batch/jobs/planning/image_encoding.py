"""A chat row with images as a vision-language model's prompt: the row's images decoded
(`io.image_sources.load_image`), the model's own processor run on them and the rendered chat
text (as `apply_chat_template(..., tokenize=True)` would: the template wrote the special
tokens), and each image's placeholder tokens turned into its content ids
(`engine.vision.image_inputs.image_prompt`), so the planner orders and groups rows by the
text before an image and the image itself. A bad image is the row's error, in one line.

Decoded images live only while their row is encoded: what a row keeps is its processor
output (pixel tensors), dropped when the row's request is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astrai_batch.engine.vision.image_inputs import image_prompt
from astrai_batch.errors import ImageError
from astrai_batch.io.image_sources import ImageLimits, ImageRef, check_image_count, load_image


def encode_image_row(
    tower: Any, model_name: str, text: str, refs: Sequence[ImageRef], limits: ImageLimits
) -> tuple[tuple[int, ...], tuple] | str:
    """(the prompt's token ids with content ids, its `ImageInput`s), or the row's error."""
    processor = tower.processor
    if processor is None:
        return (
            f"model {model_name!r} has no image processor saved with it "
            "(preprocessor_config.json), so its images cannot be prepared"
        )
    try:
        check_image_count(len(refs), limits)
        images = [load_image(ref, limits).image for ref in refs]
    except ImageError as exc:
        return str(exc)
    try:
        batch = processor(images=images, text=text, add_special_tokens=False, return_tensors="pt")
    except Exception as exc:  # a processor may raise anything on odd input
        return f"image processing failed: {_one_line(exc)}"
    pixels = batch["pixel_values"]
    try:
        ids, inputs = image_prompt(
            batch["input_ids"][0].tolist(),
            tower.image_token_id,
            [pixels[i : i + 1] for i in range(len(images))],
            tower.image_lengths(len(images)),
        )
    except ValueError as exc:
        return f"the chat template's image placeholders do not fit the images: {exc}"
    return tuple(ids), inputs


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
