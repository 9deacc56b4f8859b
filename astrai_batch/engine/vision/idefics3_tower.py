"""Idefics3 and SmolVLM: a SigLIP vision encoder and a pixel-shuffle connector; the
processor splits a large image into crops of the encoder's size plus the whole image
resized to it (the global image), every one of them a "frame" of `image_seq_len` features.

The prompt writes each crop as `<fake_token_around_image><row_r_col_c>` then its
`image_seq_len` `<image>` tokens, rows of crops apart by a newline, then the global image
after `<global-img>`: an image's placeholders are one run per frame with text between them
(`ImageInput.runs`). The image is still one input: one key over all its frames, one load,
one encoder call over all its frames (`encode`). That call is what transformers makes for a
one-image row (for several images it makes one over all their frames: the same bits, tested);
frame by frame would be other GEMM shapes, each free to round otherwise, so the frames are
never encoded apart.

The frame count travels with the image (its `extras`: a 1-element tensor), so its
placeholder count is known before its pixels are loaded again. SmolVLM's modeling is
Idefics3's under its own classes; its processor needs `num2words` (and its video part
torchvision), without which the model runs text rows and refuses image rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.tower import VisionTower

_GLOBAL_IMAGE_TAG = "<global-img>"  # before an image's last frame (Idefics3 and SmolVLM)


class Idefics3Tower(VisionTower):
    split_placeholders = True

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        super().__init__(vlm, processor)
        config = vlm.config
        vision = config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        # the connector's pixel shuffle folds scale_factor^2 patches into one feature
        self.frame_tokens = int(patches / config.scale_factor**2)

    @staticmethod
    def frames(extras: tuple[torch.Tensor, ...]) -> int:
        if not extras or tuple(extras[0].shape) != (1,):
            raise ValueError("an Idefics3 image needs its frame count (1 element)")
        return int(extras[0][0])

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        return [self.frames(more) * self.frame_tokens for more in extras]

    def image_extras(self, out: Any) -> tuple[torch.Tensor, ...]:
        # one image alone: its frames are the processor's second axis, none of them padding
        return (torch.tensor([out["pixel_values"].shape[1]]),)

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        """One prompt's frames cut per image: an image ends with the frame after its
        `<global-img>` tag (needs the processor's tokenizer for the tag's id)."""
        if "pixel_values" not in batch:
            return []
        if self.processor is None:
            raise ValueError("splitting an Idefics3 processor output needs its processor")
        tag = self.processor.tokenizer.convert_tokens_to_ids(_GLOBAL_IMAGE_TAG)
        ids = batch["input_ids"][0].tolist()
        counts, frames = [], 0
        for i, token in enumerate(ids):
            if token == self.image_token_id and (i == 0 or ids[i - 1] != token):
                frames += 1  # a run of placeholders starts: one frame
                if i > 0 and ids[i - 1] == tag:
                    counts.append(frames)
                    frames = 0
        pixels = batch["pixel_values"][0]
        if sum(counts) != len(pixels):
            raise ValueError(f"the prompt names {sum(counts)} frames for {len(pixels)} given")
        parts = torch.split(pixels, counts)
        return [(p.unsqueeze(0), (torch.tensor([len(p)]),)) for p in parts]

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """By the model's own `get_image_features` (SigLIP encoder, pixel shuffle,
        projection) on all the image's frames at once: [frames x image_seq_len, hidden]."""
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device), return_dict=True
        )
        return self._checked(image, torch.cat(list(out.pooler_output), dim=0))
