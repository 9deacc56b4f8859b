"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: images of any size, each its own grid of patches,
and multimodal rotary positions (M-RoPE) for the language model (Qwen3-VL: and DeepStack
features, `encode`).

An image's placeholder count is its own `image_grid_thw` product over `merge_size^2`, so the
grid travels with the image (`ImageInput.extras`, keyed with its pixels). The processor
gives several images as one flat tensor of patches; `split_processed` cuts it per image,
which is what the image processor makes for each image alone. The language model's decoder
is Qwen2's (Qwen3's) with M-RoPE: it runs under `Qwen2ForCausalLM` (`Qwen3ForCausalLM`; no
causal-LM class exists for its text config), fed each step's positions as (text, temporal,
height, width) rows (`rope_positions`, `mrope_positions`): row 0 the tokens' own positions,
which is what transformers' text model takes from a 4-row tensor for packed sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.mrope_positions import mrope_positions
from astrai_batch.engine.vision.tower import VisionTower


class QwenVLTower(VisionTower):
    extra_names = ("image_grid_thw",)

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        super().__init__(vlm, processor)
        self.merge = int(vlm.config.vision_config.spatial_merge_size)

    @staticmethod
    def causal_lm_class(text_config: Any) -> type:
        import transformers

        # Qwen2-VL's and Qwen2.5-VL's decoder is Qwen2's, Qwen3-VL's Qwen3's (q/k norms)
        qwen3 = text_config.model_type == "qwen3_vl_text"
        return transformers.Qwen3ForCausalLM if qwen3 else transformers.Qwen2ForCausalLM

    def grid(self, extras: tuple[torch.Tensor, ...]) -> tuple[int, int, int]:
        """(frames, height, width) of the image in merged patches, from its grid_thw."""
        if not extras or tuple(extras[0].shape) != (1, 3):
            raise ValueError("a Qwen-VL image needs its image_grid_thw (1 x 3)")
        t, h, w = (int(v) for v in extras[0][0])
        return t, h // self.merge, w // self.merge

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        return [int(np.prod(self.grid(more))) for more in extras]

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        if "image_grid_thw" not in batch:
            return []
        grids = batch["image_grid_thw"]
        sizes = grids.prod(-1).tolist()
        pixels = torch.split(batch["pixel_values"], sizes)
        return [(p, (grids[i : i + 1],)) for i, p in enumerate(pixels)]

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """By the model's own `get_image_features` (patch embedding, vision blocks, merger).
        Qwen3-VL's DeepStack features follow in the same rows ([placeholders, hidden x (1 +
        DeepStack layers)]: one tensor per image in the encoder cache; `step_embeddings`
        splits them)."""
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device),
            image_grid_thw=image.extras[0].to(device),
            return_dict=True,
        )
        parts = [torch.cat(list(out.pooler_output), dim=0)]
        for layer in getattr(out, "deepstack_features", None) or ():
            parts.append(torch.cat(list(layer), dim=0))
        return self._checked(image, torch.cat(parts, dim=-1))

    def rope_positions(self, chunks: Sequence[Any]) -> np.ndarray | None:
        """[3, tokens]: each chunk's M-RoPE positions; None when no chunk's sequence has an
        image (every position is then its token's own, as for a text model)."""
        if not any(chunk.images for chunk in chunks):
            return None
        parts = []
        for chunk in chunks:
            count = len(chunk.token_ids)
            grids = [(image.offset, *self.grid(image.extras)) for image in chunk.images]
            if not grids or chunk.images[-1].end <= chunk.start:  # decode: text after them all
                shift = sum(max(h, w) - t * h * w for _, t, h, w in grids)
                first = chunk.start + shift
                parts.append(np.tile(np.arange(first, first + count, dtype=np.int64), (3, 1)))
            else:
                parts.append(mrope_positions(grids, chunk.start, count))
        return np.concatenate(parts, axis=1)
