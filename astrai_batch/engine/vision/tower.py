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
from typing import Any, NamedTuple

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from astrai_batch.engine.model.support import VISION_MODEL_TYPES
from astrai_batch.engine.vision.encoder_cache import EncoderCache
from astrai_batch.engine.vision.image_inputs import ImageInput


class VisionTower:
    """The vision half of a loaded VLM, one family's subclass: its image token, how many
    placeholders each image takes, the encoder, and the processor that makes its inputs
    (None when not loaded). `bidirectional_images`: an image's placeholders attend to each
    other at prefill (`image_spans`); in other families they are causal like text."""

    # the processor's outputs for an image, besides its pixel_values, that the family needs
    # (`ImageInput.extras`, in this order)
    extra_names: tuple[str, ...] = ()
    bidirectional_images = False
    # an image's placeholders may be several runs with text between (`ImageInput.runs`)
    split_placeholders: bool = False

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        config = vlm.config
        if config.model_type not in VISION_MODEL_TYPES:
            raise ValueError(f"model type {config.model_type!r} has no vision support")
        self.vlm = vlm
        self.processor = processor
        self.image_token_id = int(config.image_token_id)

    @staticmethod
    def causal_lm_class(text_config: Any) -> type:
        """The causal-LM class that holds the language half (`language_model`)."""
        return AutoModelForCausalLM._model_mapping[type(text_config)]

    @classmethod
    def language_half(cls, vlm: Any) -> torch.nn.Module:
        """The VLM's decoder and LM head as the engine runs them (`language_model`)."""
        return language_model(vlm, cls.causal_lm_class(vlm.config.text_config))

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        """The placeholder count of each image, from its `extras` (one tuple per image)."""
        raise NotImplementedError

    def image_extras(self, out: Any) -> tuple[torch.Tensor, ...]:
        """An image's `extras` from the image processor's output for it alone."""
        return tuple(out[name] for name in self.extra_names)

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        """A processor output's images one by one: (pixel_values, extras) each, as the
        image processor makes them for that image alone."""
        raise NotImplementedError

    def encode(self, image: ImageInput) -> torch.Tensor:
        """One image's features [placeholders, text hidden size]."""
        raise NotImplementedError

    def rope_positions(self, chunks: Sequence[Any]) -> np.ndarray | None:
        """The step's rotary positions where the model's differ from the tokens' positions
        ([rows, tokens]; M-RoPE), else None (the step's positions serve)."""
        return None

    def _checked(self, image: ImageInput, features: torch.Tensor) -> torch.Tensor:
        if features.shape[0] != image.length:
            raise ValueError(
                f"the image encodes to {features.shape[0]} features for {image.length} "
                "placeholder tokens"
            )
        return features.to(self.vlm.lm_head.weight.dtype)


class FixedCountTower(VisionTower):
    """A family whose processor resizes every image to the tower's size, so every image
    takes the same count (`tokens_per_image`) and its pixels are one row of the batch's."""

    tokens_per_image: int

    def image_lengths(self, extras: Sequence[tuple[torch.Tensor, ...]]) -> list[int]:
        return [self.tokens_per_image] * len(extras)

    def split_processed(self, batch: Any) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        pixels = batch.get("pixel_values", ())
        return [(pixels[i : i + 1], ()) for i in range(len(pixels))]


class LlavaTower(FixedCountTower):
    """LLaVA: the tower's patches, less the CLS position the "default" strategy drops."""

    def __init__(self, vlm: Any, processor: Any = None) -> None:
        super().__init__(vlm, processor)
        config = vlm.config
        vision = config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        # "default" drops the CLS position, "full" keeps it
        self.tokens_per_image = patches + (config.vision_feature_select_strategy == "full")

    @torch.inference_mode()
    def encode(self, image: ImageInput) -> torch.Tensor:
        """By the model's own `get_image_features` (vision tower, feature layer and strategy,
        projector)."""
        config = self.vlm.config
        device = self.vlm.lm_head.weight.device
        out = self.vlm.model.get_image_features(
            pixel_values=image.pixel_values.to(device),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            return_dict=True,
        )
        return self._checked(image, torch.cat(list(out.pooler_output), dim=0))


def language_model(vlm: Any, cls: type | None = None) -> torch.nn.Module:
    """The VLM's decoder and LM head as a causal-LM model (`cls`, by default its text
    config's), sharing weights."""
    text_config = vlm.config.text_config
    if cls is None:
        cls = AutoModelForCausalLM._model_mapping[type(text_config)]
    # a text config of another type (a VLM's text half under a text model's class): the
    # class's own config of the same values, for the meta skeleton only (its modules are
    # replaced below; the rope is the text model's own, M-RoPE keys and all)
    skeleton = text_config
    if not isinstance(text_config, cls.config_class):
        values = text_config.to_dict()
        values.pop("rope_parameters", None)
        skeleton = cls.config_class(**values)
    with torch.device("meta"):
        lm = cls(skeleton)
    decoder = getattr(vlm.model, "language_model", None)
    lm.model = decoder if decoder is not None else vlm.model.text_model  # Idefics3's name
    lm.lm_head = vlm.lm_head
    lm.config = text_config
    lm.eval()
    lm.requires_grad_(False)
    if any(p.is_meta for p in lm.parameters()):
        raise ValueError(f"{cls.__name__} has layers beyond the decoder and the LM head")
    return lm


class StepImages(NamedTuple):
    """A step's image inputs: its input embeddings, and for Qwen3-VL's DeepStack (features
    from inner vision layers added to the first decoder layers' outputs at the image rows)
    the rows holding image features ([tokens] bool) and each such layer's features for
    them ([rows, hidden]); None for other models."""

    embeds: torch.Tensor
    visual_rows: torch.Tensor | None = None
    deepstack: list[torch.Tensor] | None = None


def step_embeddings(
    chunks: Sequence[Any],
    token_ids: torch.Tensor,
    embed: torch.nn.Module,
    cache: EncoderCache,
    image_token_id: int,
) -> StepImages | None:
    """The packed step's input embeddings where a chunk covers image placeholders (content
    ids: the features of their image rows), else None (the step runs on token ids). An
    image's features wider than the hidden size carry its DeepStack features after the
    first `hidden` columns (`QwenVLTower.encode`)."""
    covered = []  # (image, its pieces in the step: (step row, first feature, stop))
    base = 0
    for chunk in chunks:
        start = chunk.start
        end = start + len(chunk.token_ids)
        for image in chunk.images:
            pieces = []
            done = 0  # features before this run (an image's runs hold them in order)
            for at, count in image.spans:
                lo, hi = max(start, at), min(end, at + count)
                if lo < hi:
                    pieces.append((base + lo - start, done + lo - at, done + hi - at))
                done += count
            if pieces:
                covered.append((image, pieces))
        base += len(chunk.token_ids)
    if not covered:
        return None
    ids = torch.where(token_ids < 0, image_token_id, token_ids)
    embeds = embed(ids)
    hidden = embeds.shape[-1]
    deep = []
    spans = []
    for image, pieces in covered:  # one lookup per image and chunk, whatever its runs
        features = cache.features(image, finishes=pieces[-1][2] == image.length)
        for row, first, stop in pieces:
            spans.append((row, first, stop))
            embeds[row : row + stop - first] = features[first:stop, :hidden]
            if features.shape[-1] > hidden:
                deep.append(features[first:stop, hidden:])
    if not deep:
        return StepImages(embeds)
    rows = torch.zeros(len(ids), dtype=torch.bool, device=embeds.device)
    for row, first, stop in spans:
        rows[row : row + stop - first] = True
    stacked = torch.cat(deep).unflatten(-1, (-1, hidden))  # [rows, layers, hidden]
    return StepImages(embeds, rows, list(stacked.unbind(1)))
