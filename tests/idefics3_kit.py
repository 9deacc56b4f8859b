"""Tiny random Idefics3 and SmolVLM saved as model directories (weights, tokenizer, image
processor; Idefics3's processor too), and the processor tests prepare their prompts with."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from vision_kit import VISION_CHAT_TEMPLATE

FRAME = 32  # the encoder's image size: each crop and the global image
PATCH = 4
SCALE = 2  # pixel shuffle: 2x2 patches per feature
FRAME_TOKENS = (FRAME // PATCH) ** 2 // SCALE**2  # 16 placeholders per frame

IDEFICS3_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]


def idefics3_tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": IDEFICS3_TOKENS})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    return tokenizer


def image_processor(model_type: str, splitting: bool = True):
    """The family's image processor (PIL): images up to 64 px on their longest edge, split
    into 32 px crops (up to 2 x 2) plus the global image, or (`splitting` off) the global
    image alone."""
    from transformers import Idefics3ImageProcessorPil, SmolVLMImageProcessorPil

    cls = SmolVLMImageProcessorPil if model_type == "smolvlm" else Idefics3ImageProcessorPil
    return cls(
        size={"longest_edge": 2 * FRAME},
        max_image_size={"longest_edge": FRAME},
        do_image_splitting=splitting,
    )


def idefics3_processor(model_type: str, splitting: bool = True):
    """Idefics3's processor over the family's image processor. (SmolVLM's own processor
    writes the same image prompt but needs num2words, not installed here.)"""
    from transformers import Idefics3Processor

    return Idefics3Processor(
        image_processor=image_processor(model_type, splitting),
        tokenizer=idefics3_tokenizer(),
        image_seq_len=FRAME_TOKENS,
        chat_template=VISION_CHAT_TEMPLATE,
    )


def save_tiny_idefics3(path: Path, model_type: str, seed: int = 7) -> Path:
    """An Idefics3 ("idefics3") or SmolVLM ("smolvlm"): a 2-layer SigLIP tower (32 px
    frames, 4 px patches, 2x2 pixel shuffle: 16 features a frame) and the tiny Llama
    decoder, random weights; tokenizer and image processor saved beside (Idefics3: its
    processor too)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
    )

    tokenizer = idefics3_tokenizer()
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=FRAME,
        patch_size=PATCH,
    )
    text = {**tiny_config_kwargs(tokenizer), "model_type": "llama"}
    smol = model_type == "smolvlm"
    config_cls = SmolVLMConfig if smol else Idefics3Config
    model_cls = SmolVLMForConditionalGeneration if smol else Idefics3ForConditionalGeneration
    config = config_cls(
        vision_config=vision,
        text_config=text,
        scale_factor=SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    model.save_pretrained(path)
    if smol:
        image_processor(model_type).save_pretrained(path)
    else:
        idefics3_processor(model_type).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
