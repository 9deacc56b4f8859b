"""LLaVA-NeXT ("anyres"): an image becomes a base tile (the whole image at the tower's size)
and a grid of tiles of the resolution in `image_grid_pinpoints` that fits it best; the
grid's features are cut back to the image's aspect ratio (unpadded) and an `image_newline`
vector ends each row of them. So an image's placeholder count depends on its size: the
processor's `image_sizes` (height, width) travel with its pixels (`ImageInput.extras`).

The processor pads every image of a prompt to the most tiles any of them takes;
`split_processed` keeps each image's own tiles, which is what the image processor makes for
that image alone (so one image has one content key whatever prompt it came in). The tower
runs all tiles of one image in one call: the shapes, hence the bits, of transformers' own
`get_image_features` on that image alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.tower import VisionTower


class LlavaNextTower(VisionTower):
    extra_names = ("image_sizes",)

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        super().__init__(vlm, processor)
        config = vlm.config
        self.tile = int(config.vision_config.image_size)
        self.side = self.tile // int(config.vision_config.patch_size)  # patches per tile edge
        self.pinpoints = [list(p) for p in config.image_grid_pinpoints]
        # "default" drops each tile's CLS position, "full" keeps it
        self.base = self.side * self.side + (config.vision_feature_select_strategy == "full")

    def image_size(self, extras: tuple[torch.Tensor, ...]) -> tuple[int, int]:
        """(height, width) of the image before processing, from its image_sizes."""
        if not extras or tuple(extras[0].shape) != (1, 2):
            raise ValueError("a LLaVA-NeXT image needs its image_sizes (1 x 2)")
        height, width = (int(v) for v in extras[0][0])
        return height, width

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of grid tiles the processor cuts an image of this size into."""
        from transformers.image_processing_utils import select_best_resolution

        best_height, best_width = select_best_resolution((height, width), self.pinpoints)
        return best_height // self.tile, best_width // self.tile

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        """The base tile's features, then the grid's feature rows and columns left after
        unpadding (as transformers' `unpad_image` cuts them), each row plus its newline."""
        lengths = []
        for more in extras:
            height, width = self.image_size(more)
            rows, columns = self.grid(height, width)
            current_height, current_width = rows * self.side, columns * self.side
            if width / height > current_width / current_height:
                kept = int(round(height * (current_width / width), 7))
                current_height -= (current_height - kept) // 2 * 2
            else:
                kept = int(round(width * (current_height / height), 7))
                current_width -= (current_width - kept) // 2 * 2
            lengths.append(self.base + current_height * (current_width + 1))
        return lengths

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        if "image_sizes" not in batch:
            return []
        sizes = batch["image_sizes"]
        pixels = batch["pixel_values"]
        split = []
        for i in range(len(sizes)):
            rows, columns = self.grid(*self.image_size((sizes[i : i + 1],)))
            tiles = 1 + rows * columns  # the base tile, then the grid's
            split.append((pixels[i][:tiles].unsqueeze(0), (sizes[i : i + 1],)))
        return split

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """By the model's own `get_image_features` (vision tower on the image's tiles, feature
        layer and strategy, projector, unpadding and newlines)."""
        config = self.vlm.config
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device),
            image_sizes=image.extras[0].to(device),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            return_dict=True,
        )
        return self._checked(image, torch.cat(list(out.pooler_output), dim=0))
