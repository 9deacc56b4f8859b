"""A chat row with images as a vision-language model's prompt: the row's images decoded
(`io.image_sources.load_image`), the model's own processor run on them and the rendered chat
text (as `apply_chat_template(..., tokenize=True)` would: the template wrote the special
tokens), and each image's placeholder tokens turned into its content ids
(`engine.vision.image_inputs.image_prompt`), so the planner orders and groups rows by the
text before an image and the image itself. A bad image is the row's error, in one line.

Decoded images live only while their row is encoded: a row in its window keeps each image's
key and how to load it again (its `ImageRef`: for a Parquet cell, where its bytes are stored,
`io.image_cells`), and the engine loads the pixels when the row's request
arrives, so the requests in the engine (bounded by its waiting list and batch) are the only
ones holding pixels or cell bytes. The cost: an image is read, decoded and preprocessed
twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from astrai_batch.engine.vision.image_inputs import image_prompt
from astrai_batch.errors import ImageError
from astrai_batch.io.image_cells import CellReader
from astrai_batch.io.image_sources import ImageLimits, ImageRef, check_image_count, load_image


def encode_image_row(
    tower: Any,
    model_name: str,
    text: str,
    refs: Sequence[ImageRef],
    limits: ImageLimits,
    cells: CellReader | None = None,
) -> tuple[tuple[int, ...], tuple] | str:
    """(the prompt's token ids with content ids, its `ImageInput`s), or the row's error. The
    images keep a loader, not their pixels (`ImageInput.materialized`); Parquet cells'
    bytes are read through `cells`, at both loads."""
    processor = tower.processor
    if processor is None:
        return (
            f"model {model_name!r} has no image processor saved with it "
            "(preprocessor_config.json), or its processor needs a package not installed "
            "(Qwen-VL's: torchvision; SmolVLM's: num2words, torchvision), so its images "
            "cannot be prepared"
        )
    try:
        check_image_count(len(refs), limits)
        images = [load_image(ref, limits, cells).image for ref in refs]
    except ImageError as exc:
        return str(exc)
    try:
        ids = processor(images=images, text=text, add_special_tokens=False)["input_ids"][0]
        processed = [image_tensors(processor, image, tower) for image in images]
    except Exception as exc:  # a processor may raise anything on odd input
        return f"image processing failed: {_one_line(exc)}"
    loaders = [ImageReload(ref, limits, processor, cells) for ref in refs]
    extras = [more for _, more in processed]
    try:
        ids, inputs = image_prompt(
            ids,
            tower.image_token_id,
            [pixels for pixels, _ in processed],
            tower.image_lengths(extras),
            loaders,
            extras,
            split=tower.split_placeholders,
        )
    except ValueError as exc:
        return f"the chat template's image placeholders do not fit the images: {exc}"
    return tuple(ids), inputs


def image_tensors(
    processor: Any, image: Any, tower: Any = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One image's pixel tensor and the `extras` its tower takes (`VisionTower.image_extras`;
    none without a tower), as the processor makes them for a prompt (its image processor,
    on this image alone)."""
    out = processor.image_processor(images=[image], return_tensors="pt")
    return out["pixel_values"], (() if tower is None else tower.image_extras(out))


@dataclass(frozen=True)
class ImageReload:
    """An `ImageInput.load`: the image's pixel tensor made again (read, decode, process)
    when its request enters the engine. Pickled (a Ray task's rows, for the workers) as its
    `ref` and `limits` only: the worker binds its own processor and cell reader (`bound`),
    so a row never carries the processor (and its tokenizer) along."""

    ref: ImageRef
    limits: ImageLimits
    processor: Any = field(default=None, compare=False)
    cells: CellReader | None = field(default=None, compare=False)

    def __call__(self) -> torch.Tensor:
        if self.processor is None:
            raise ImageError(f"image {self.ref.source} reached an engine without its processor")
        return image_tensors(self.processor, load_image(self.ref, self.limits, self.cells).image)[0]

    def __reduce__(self) -> tuple:
        return (ImageReload, (self.ref, self.limits))

    def bound(self, processor: Any, cells: CellReader | None) -> ImageReload:
        return dataclasses.replace(self, processor=processor, cells=cells)


def with_processor(images: tuple, processor: Any, cells: CellReader | None) -> tuple:
    """A row's `ImageInput`s with their loads bound to `processor` and `cells` (a worker's,
    after the rows came pickled from the task that encoded them)."""
    return tuple(
        dataclasses.replace(image, load=image.load.bound(processor, cells))
        if isinstance(image.load, ImageReload)
        else image
        for image in images
    )


def vision_model_at(location: str, trust_remote_code: bool = False) -> bool:
    """Whether the model whose files are at `location` (a directory or hub cache entry, as
    `load_tokenizer` gives it) is a vision-language model the engine runs."""
    return _vision_config(location, trust_remote_code) is not None


def weightless_tower(location: str, trust_remote_code: bool = False) -> Any:
    """A vision model's `VisionTower` without weights (its config and processor only), for
    planning a job's prompts where no model is loaded (`plan`): its image placeholders and
    content ids are the run's; it encodes nothing. None for a text model."""
    from types import SimpleNamespace

    from astrai_batch.engine.vision.loading import load_image_processor, vision_tower

    config = _vision_config(location, trust_remote_code)
    if config is None:
        return None
    processor = load_image_processor(location, {"trust_remote_code": trust_remote_code})
    return vision_tower(SimpleNamespace(config=config), processor)


def _vision_config(location: str, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    from astrai_batch.engine.model.support import is_vision_model

    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    except Exception:  # GGUF or an unreadable config: text models only; the loader reports
        return None
    return config if is_vision_model(config) else None


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
