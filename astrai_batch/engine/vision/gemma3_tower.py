"""Gemma 3's vision half: a SigLIP tower, average-pooled to `mm_tokens_per_image` positions
and projected (transformers' `Gemma3Model.get_image_features`), one image per call.

What differs from LLaVA for the engine:

- an image's placeholders attend to each other in both directions at prefill
  (`bidirectional_images`: `image_spans`), text and decode tokens causally;
- every image is `mm_tokens_per_image` placeholders (256 for the released models), between
  the processor's `<start_of_image>` and `<end_of_image>` text tokens;
- pan-and-scan (extra crops of a wide image, each its own run of placeholders) is turned off
  in the loaded processor: every image is resized to the tower's size, one run per image;
- the word embeddings are scaled by sqrt(hidden) (`Gemma3TextScaledWordEmbedding`) before
  the image features replace the placeholder positions: `step_embeddings` embeds with the
  model's own module, then overwrites, as transformers' `masked_scatter` does;
- `Gemma3ForConditionalGeneration` applies no final logit softcapping where the text config
  names one (its causal-LM class would), so the language model here applies none either.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.tower import FixedCountTower


class Gemma3Tower(FixedCountTower):
    bidirectional_images = True

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        image_processor = getattr(processor, "image_processor", None)
        if getattr(image_processor, "do_pan_and_scan", False):
            image_processor.do_pan_and_scan = False
        super().__init__(vlm, processor)
        self.tokens_per_image = int(vlm.config.mm_tokens_per_image)

    @classmethod
    def language_half(cls, vlm: Any) -> torch.nn.Module:
        lm = super().language_half(vlm)
        if getattr(lm.config, "final_logit_softcapping", None) is not None:
            lm.config = copy.copy(lm.config)
            lm.config.final_logit_softcapping = None
        return lm

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """One image's features [mm_tokens_per_image, text hidden size]."""
        device = self.vlm.lm_head.weight.device
        pixels = image.pixel_values.to(device)  # the tower casts, as in transformers
        out = self.vlm.model.get_image_features(pixel_values=pixels, return_dict=True)
        return self._checked(image, torch.cat(list(out.pooler_output), dim=0))
