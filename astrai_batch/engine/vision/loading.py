"""Loading a vision-language model: the whole model by transformers' image-text class, its
processor, then the split into the language model the engine runs and the vision tower."""

from __future__ import annotations

from typing import Any

import torch

from astrai_batch.engine.vision.gemma3_tower import Gemma3Tower
from astrai_batch.engine.vision.tower import VisionTower

# each vision model type's tower (`tower.VISION_MODEL_TYPES` lists the same types)
TOWERS: dict[str, type[VisionTower]] = {"llava": VisionTower, "gemma3": Gemma3Tower}


def make_tower(vlm: Any, processor: Any = None) -> VisionTower:
    """The `VisionTower` of the VLM's model type (`vlm` may be a config holder only)."""
    return TOWERS.get(vlm.config.model_type, VisionTower)(vlm, processor)


def load_vision_model(location: str, hub: dict[str, Any], weights: dict[str, Any]):
    """(the language model as a causal LM, its `VisionTower`). The processor is None when the
    model directory has none (text prompts still run; image rows are refused)."""
    from transformers import AutoModelForImageTextToText

    vlm = AutoModelForImageTextToText.from_pretrained(location, **hub, **weights)
    vlm.eval()
    vlm.requires_grad_(False)
    processor = load_image_processor(location, hub)
    tower = make_tower(vlm, processor)
    with torch.inference_mode(False):
        lm = tower.language_model(vlm)
    return lm, tower


def load_image_processor(location: str, hub: dict[str, Any]) -> Any:
    """The model's processor, or None when it has none that prepares images (a tokenizer
    alone: text prompts still run; image rows are refused)."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(location, **hub)
    except (OSError, ValueError, TypeError):
        return None
    return processor if hasattr(processor, "image_processor") else None
