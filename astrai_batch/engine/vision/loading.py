"""Loading a vision-language model: the whole model by transformers' image-text class, its
processor, then the split into the language model the engine runs and the vision tower of
its family (`vision_tower`)."""

from __future__ import annotations

from typing import Any

import torch

from astrai_batch.engine.vision.gemma3_tower import Gemma3Tower
from astrai_batch.engine.vision.idefics3_tower import Idefics3Tower
from astrai_batch.engine.vision.llava_next_tower import LlavaNextTower
from astrai_batch.engine.vision.pixtral_processor import pixtral_processor
from astrai_batch.engine.vision.pixtral_tower import PixtralTower
from astrai_batch.engine.vision.qwen_vl_tower import QwenVLTower
from astrai_batch.engine.vision.tower import LlavaTower, VisionTower

# each vision model type's tower (every type in `model.support.VISION_MODEL_TYPES`)
_TOWERS: dict[str, type[VisionTower]] = {
    "llava": LlavaTower,
    "llava_next": LlavaNextTower,
    "qwen2_vl": QwenVLTower,
    "qwen2_5_vl": QwenVLTower,
    "qwen3_vl": QwenVLTower,
    "gemma3": Gemma3Tower,
    "idefics3": Idefics3Tower,
    "smolvlm": Idefics3Tower,  # Idefics3's code under its own config and processor classes
    "mistral3": PixtralTower,
}


def tower_class(config: Any) -> type[VisionTower]:
    try:
        return _TOWERS[config.model_type]
    except KeyError:
        raise ValueError(f"model type {config.model_type!r} has no vision support") from None


def vision_tower(vlm: Any, processor: Any = None) -> VisionTower:
    """The tower of `vlm`'s family (a config alone will do for `vlm.config`: no encoding)."""
    return tower_class(vlm.config)(vlm, processor)


def load_vision_model(location: str, hub: dict[str, Any], weights: dict[str, Any]):
    """(the language model as a causal LM, its `VisionTower`). The processor is None when the
    model directory has none (text prompts still run; image rows are refused)."""
    from transformers import AutoModelForImageTextToText

    vlm = AutoModelForImageTextToText.from_pretrained(location, **hub, **weights)
    vlm.eval()
    vlm.requires_grad_(False)
    processor = load_image_processor(location, hub)
    tower = tower_class(vlm.config)
    with torch.inference_mode(False):
        lm = tower.language_half(vlm)
    return lm, tower(vlm, processor)


def load_image_processor(location: str, hub: dict[str, Any]) -> Any:
    """The model's processor, or None when it has none that prepares images (a tokenizer
    alone, or one whose parts need a package not installed, such as Qwen-VL's video
    processor without torchvision: text prompts still run; image rows are refused)."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(location, **hub)
    except ImportError:
        # Mistral 3's PixtralProcessor needs torchvision: the same work from transformers'
        # Pillow image processor (`pixtral_processor`)
        return pixtral_processor(location, hub)
    except (OSError, ValueError, TypeError):
        return None
    return processor if hasattr(processor, "image_processor") else None
