"""Mistral 3 (Mistral-Small-3.1 and later): a Pixtral vision encoder (2-D rotary patches at
the image's own resolution), a patch merger folding `spatial_merge_size`^2 patches into one
feature, and a projector.

An image of h x w merged patches is written `[IMG]` x w then `[IMG_BREAK]`, row after row,
the last row ending in `[IMG_END]` instead: `[IMG_BREAK]` and `[IMG_END]` are vocabulary
tokens with embeddings of their own, so an image's placeholders are h runs of w with one
real token between them (`ImageInput.runs`), and its features fill the `[IMG]` positions in
row order, as transformers' `masked_scatter` does. The image is one input: one key, one
encoder call (the size travels in its `extras`, so its placeholder count is known before its
pixels are loaded again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.tower import VisionTower


class PixtralTower(VisionTower):
    split_placeholders = True
    extra_names = ("image_sizes",)

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        super().__init__(vlm, processor)
        config = vlm.config
        # pixels per merged feature along each side
        self.feature_pixels = int(config.vision_config.patch_size * config.spatial_merge_size)

    def grid(self, extras: tuple[torch.Tensor, ...]) -> tuple[int, int]:
        """(rows, columns) of merged features of an image from its `image_sizes` extra."""
        if not extras or extras[0].numel() != 2:
            raise ValueError("a Pixtral image needs its (height, width) in pixels")
        height, width = (int(v) for v in extras[0].reshape(-1))
        return height // self.feature_pixels, width // self.feature_pixels

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        return [rows * columns for rows, columns in (self.grid(more) for more in extras)]

    def image_extras(self, out: Any) -> tuple[torch.Tensor, ...]:
        return (torch.as_tensor(out["image_sizes"]).reshape(1, 2),)

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        """A processor output's images one by one, each cropped from the batch's padding to
        its own size (what the image processor makes for it alone)."""
        if "pixel_values" not in batch:
            return []
        out = []
        for pixels, size in zip(batch["pixel_values"], batch["image_sizes"], strict=True):
            height, width = (int(v) for v in size)
            out.append((pixels[None, :, :height, :width], (torch.as_tensor(size).reshape(1, 2),)))
        return out

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """By the model's own `get_image_features` (Pixtral encoder, patch merger,
        projector) on this image alone: [rows x columns, hidden], in row order."""
        config = self.vlm.config
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device),
            image_sizes=image.extras[0].to(device),
            vision_feature_layer=config.vision_feature_layer,
            return_dict=True,
        )
        return self._checked(image, torch.cat(list(out.pooler_output), dim=0))
