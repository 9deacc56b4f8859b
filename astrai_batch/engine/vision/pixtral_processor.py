"""Mistral 3's processor where transformers' own cannot load: `PixtralProcessor` requires
torchvision (its module imports the torchvision image processor for one helper), which the
CPU setup does not carry (docs/multimodal.md). It does two things, both rebuilt here from
transformers' parts: the images through `PixtralImageProcessorPil` (transformers' own Pillow
image processor, its patch size times the spatial merge, as `PixtralProcessor` passes it),
and the text, where each `[IMG]` becomes the image's rows of `[IMG]` x columns, each row
ending in `[IMG_BREAK]` and the last in `[IMG_END]` (`PixtralProcessor.replace_image_token`).
The tests compare it with a brute force of that rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


class PixtralPilProcessor:
    """The parts of `PixtralProcessor` the job uses: `__call__(images=, text=)`,
    `image_processor`, `tokenizer` and `apply_chat_template`."""

    def __init__(
        self,
        tokenizer: Any,
        image_processor: Any,
        patch_size: int,
        spatial_merge_size: int,
        chat_template: str | None = None,
        image_token: str = "[IMG]",
        image_break_token: str = "[IMG_BREAK]",
        image_end_token: str = "[IMG_END]",
    ) -> None:
        self.tokenizer = tokenizer
        self.feature_pixels = patch_size * spatial_merge_size
        # every call of the image processor (a row's first load and the engine's reload)
        # resizes to whole features, as PixtralProcessor's own calls do
        image_processor.patch_size = {"height": self.feature_pixels, "width": self.feature_pixels}
        self.image_processor = image_processor
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        self.image_token = image_token
        self.image_break_token = image_break_token
        self.image_end_token = image_end_token

    def __call__(
        self, images: Any = None, text: str | None = None, add_special_tokens: bool = True, **_
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        sizes: list[tuple[int, int]] = []
        if images:
            processed = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = processed["pixel_values"]
            out["image_sizes"] = torch.as_tensor(processed["image_sizes"])
            sizes = [(int(h), int(w)) for h, w in out["image_sizes"].tolist()]
        pieces = (text or "").split(self.image_token)
        if len(pieces) != len(sizes) + 1:
            raise ValueError(
                f"the text has {len(pieces) - 1} {self.image_token} tokens for {len(sizes)} images"
            )
        expanded = pieces[0]
        for (height, width), after in zip(sizes, pieces[1:], strict=True):
            expanded += self._placeholders(height, width) + after
        ids = self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
        out["input_ids"] = [ids]
        return out

    def _placeholders(self, height: int, width: int) -> str:
        row = self.image_token * (width // self.feature_pixels) + self.image_break_token
        rows = row * (height // self.feature_pixels)
        return rows[: -len(self.image_break_token)] + self.image_end_token

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(
            conversation, chat_template=self.chat_template, **kwargs
        )


def pixtral_processor(location: str, hub: dict[str, Any]) -> PixtralPilProcessor | None:
    """The processor of a model directory whose `processor_config.json` names
    `PixtralProcessor`, built from transformers' parts; None for any other directory."""
    directory = Path(location)
    try:
        config = json.loads((directory / "processor_config.json").read_text())
    except (OSError, ValueError):
        return None
    if config.get("processor_class") != "PixtralProcessor":
        return None
    from transformers import AutoTokenizer, PixtralImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(location, **hub)
    image_processor = PixtralImageProcessorPil.from_pretrained(location, **hub)
    template = directory / "chat_template.jinja"
    chat_template = template.read_text() if template.is_file() else None
    tokens = {
        key: config[key]
        for key in ("image_token", "image_break_token", "image_end_token")
        if key in config
    }
    return PixtralPilProcessor(
        tokenizer,
        image_processor,
        int(config.get("patch_size", 16)),
        int(config.get("spatial_merge_size", 1)),
        chat_template,
        **tokens,
    )
