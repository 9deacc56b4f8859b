"""Tiny random Qwen2-VL and Qwen2.5-VL saved as model directories (weights, tokenizer,
image processor), and the processor tests prepare their prompts with."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH = 8
MERGE = 2

# the fixture tokenizer's template with content parts, an image as Qwen's templates write it
QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_tiny_qwen_vl(path: Path, model_type: str, seed: int = 7) -> Path:
    """A Qwen2-VL ("qwen2_vl"), Qwen2.5-VL ("qwen2_5_vl") or Qwen3-VL ("qwen3_vl"): a
    2-block vision tower (8x8 patches, 2x2 merge) and a 2-layer decoder with M-RoPE, random
    weights; the fixture tokenizer with Qwen's vision tokens and an image processor of small
    min/max pixels saved beside."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    tokenizer = qwen_vl_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    text = {
        **tiny_config_kwargs(tokenizer),
        # head_dim 16: 8 rotary frequencies, split temporal / height / width
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        },
    }
    common = dict(patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, num_heads=2)
    if model_type == "qwen2_vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, **common)
        config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    elif model_type == "qwen3_vl":  # DeepStack features from both blocks; interleaved M-RoPE
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
            initializer_range=0.3,  # DeepStack features large enough to move the tokens
            **common,
        )
        text["rope_parameters"] |= {"mrope_section": [4, 2, 2], "mrope_interleaved": True}
        config_cls, model_cls = Qwen3VLConfig, Qwen3VLForConditionalGeneration
    else:  # windowed attention in block 0, full in block 1
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            window_size=32,
            fullatt_block_indexes=[1],
            **common,
        )
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = config_cls(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    model.save_pretrained(path)
    image_processor().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def qwen_vl_tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    return tokenizer


def image_processor():
    """Qwen's image processor: images resized to whole 16-pixel cells (8-pixel patches,
    2x2 merged), between 4 and 64 merged patches."""
    from transformers import Qwen2VLImageProcessorPil

    cell = PATCH * MERGE
    return Qwen2VLImageProcessorPil(
        min_pixels=4 * cell * cell,
        max_pixels=64 * cell * cell,
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=2,
    )


def qwen_vl_processor(model_type: str):
    """The model's processor for images and text. transformers' own wants a video processor,
    which needs torchvision (not installed here): this one is the same class with images and
    text only, so its `__call__` (placeholders per image grid, mm_token_type_ids) is
    transformers'."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    base = {
        "qwen2_vl": Qwen2VLProcessor,
        "qwen2_5_vl": Qwen2_5_VLProcessor,
        "qwen3_vl": Qwen3VLProcessor,
    }[model_type]

    class ImageTextProcessor(base):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            # Qwen3-VL's processor names its image's bracketing tokens too
            self.vision_start_token, self.vision_end_token = VISION_TOKENS[:2]
            self.vision_start_token_id = tokenizer.convert_tokens_to_ids(VISION_TOKENS[0])
            self.vision_end_token_id = tokenizer.convert_tokens_to_ids(VISION_TOKENS[1])

    return ImageTextProcessor(
        image_processor(), qwen_vl_tokenizer(), chat_template=QWEN_VL_CHAT_TEMPLATE
    )
