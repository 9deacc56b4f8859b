"""A tiny random LLaVA-NeXT saved as a model directory (weights, tokenizer, processor): a
2-layer CLIP tower on 32x32 tiles of 8x8 patches, anyres grids of up to 2x2 tiles."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from vision_kit import IMAGE_TOKEN, VISION_CHAT_TEMPLATE

TILE = 32
PATCH = 8
# (height, width) canvases an image is fitted to, in tiles: 1x2, 2x1, 2x2
PINPOINTS = [[TILE, 2 * TILE], [2 * TILE, TILE], [2 * TILE, 2 * TILE]]


def save_tiny_llava_next(path: Path, seed: int = 7) -> Path:
    """A LLaVA-NeXT: the tiny Llama decoder, random weights (the image_newline vector too);
    its LlavaNextProcessor (the PIL image processor: torchvision is not installed) saved
    beside."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
    )

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    tower = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
        projection_dim=32,
    )
    config = LlavaNextConfig(
        vision_config=tower,
        text_config=LlamaConfig(**tiny_config_kwargs(tokenizer)),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_grid_pinpoints=PINPOINTS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    config.architectures = ["LlavaNextForConditionalGeneration"]
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(path)
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": TILE},
        crop_size={"height": TILE, "width": TILE},
        image_grid_pinpoints=PINPOINTS,
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        chat_template=VISION_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
