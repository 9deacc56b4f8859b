"""A vision-language model split in two: its language model, which the engine runs like any
causal LM (paged, packed, invariant), and its vision tower, run by transformers' own code.

The language half is the model's own decoder and LM head under the text config's causal-LM
class (no weights copied), so every check, probe and tiling the engine applies to a text
model applies to it unchanged and nothing reaches the vision tower: the tower keeps its own
attention implementation and plain torch layers. It encodes one image per call (`encode`),
so an image's features have the same shapes, hence the same bits, whatever else the step
holds: batch-invariant by construction, and equal to transformers' when it too has one image
in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from astrai_batch.engine.vision.encoder_cache import EncoderCache
from astrai_batch.engine.vision.image_inputs import ImageInput

# vision-language model types the engine runs, each with a tiny random-weight test against
# transformers (tests/engine/vision/test_llava_exact.py, test_gemma3_exact.py); each type's
# tower class is in `loading.TOWERS`
VISION_MODEL_TYPES: frozenset[str] = frozenset({"llava", "gemma3"})


class VisionTower:
    """The vision half of a loaded VLM: its image token, how many placeholders an image
    takes, the encoder, and the processor that makes its inputs (None when not loaded).
    `bidirectional_images`: an image's placeholders attend to each other at prefill
    (`image_spans`); LLaVA's are causal like text."""

    bidirectional_images = False

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        config = vlm.config
        if config.model_type not in VISION_MODEL_TYPES:
            raise ValueError(f"model type {config.model_type!r} has no vision support")
        self.vlm = vlm
        self.processor = processor
        self.image_token_id = int(config.image_token_id)
        self._placeholders(config)

    def _placeholders(self, config: Any) -> None:
        vision = config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        # "default" drops the CLS position, "full" keeps it
        self.tokens_per_image = patches + (config.vision_feature_select_strategy == "full")

    @staticmethod
    def language_model(vlm: Any) -> torch.nn.Module:
        """The VLM's decoder and LM head as the engine runs them (`language_model`)."""
        return language_model(vlm)

    def image_lengths(self, count: int) -> list[int]:
        """The placeholder count of each of `count` images (LLaVA: fixed by the config)."""
        return [self.tokens_per_image] * count

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """One image's features [placeholders, text hidden size], by the model's own
        `get_image_features` (vision tower, feature layer and strategy, projector)."""
        config = self.vlm.config
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            return_dict=True,
        )
        features = torch.cat(list(out.pooler_output), dim=0)
        if features.shape[0] != image.length:
            raise ValueError(
                f"the image encodes to {features.shape[0]} features for {image.length} "
                "placeholder tokens"
            )
        return features.to(self.vlm.lm_head.weight.dtype)


def language_model(vlm: Any) -> torch.nn.Module:
    """The VLM's decoder and LM head as its text config's causal-LM model, sharing weights."""
    text_config = vlm.config.text_config
    cls = AutoModelForCausalLM._model_mapping[type(text_config)]
    with torch.device("meta"):
        lm = cls(text_config)
    lm.model = vlm.model.language_model
    lm.lm_head = vlm.lm_head
    lm.config = text_config
    lm.eval()
    lm.requires_grad_(False)
    if any(p.is_meta for p in lm.parameters()):
        raise ValueError(f"{cls.__name__} has layers beyond the decoder and the LM head")
    return lm


def step_embeddings(
    chunks: Sequence[Any],
    token_ids: torch.Tensor,
    embed: torch.nn.Module,
    cache: EncoderCache,
    image_token_id: int,
) -> torch.Tensor | None:
    """The packed step's input embeddings where a chunk covers image placeholders (content
    ids: the features of their image rows), else None (the step runs on token ids)."""
    spans = []
    base = 0
    for chunk in chunks:
        start = chunk.start
        end = start + len(chunk.token_ids)
        for image in chunk.images:
            lo, hi = max(start, image.offset), min(end, image.end)
            if lo < hi:
                spans.append((base + lo - start, image, lo - image.offset, hi - image.offset))
        base += len(chunk.token_ids)
    if not spans:
        return None
    ids = torch.where(token_ids < 0, image_token_id, token_ids)
    embeds = embed(ids)
    for row, image, first, stop in spans:
        features = cache.features(image, finishes=stop == image.length)
        embeds[row : row + stop - first] = features[first:stop]
    return embeds
