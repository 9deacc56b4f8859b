"""Tiny random vision-language models saved as ordinary model directories (weights, tokenizer,
processor), the images tests feed them, and transformers' greedy reference on the same
processor output."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch
from conftest import build_tiny_tokenizer, tiny_config_kwargs

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH = 8
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2  # 16: the "default" strategy drops CLS

# the fixture tokenizer's template, with content parts: an image part becomes <image>
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_tiny_llava(path: Path, seed: int = 7) -> Path:
    """A LLaVA: a 2-layer CLIP vision tower (32x32 images, 8x8 patches) and the tiny Llama
    decoder, random weights; its LlavaProcessor (CLIP image processor + the fixture
    tokenizer with <image> added) saved beside."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    return save_llava(path, vision, None, IMAGE_SIZE, PATCH, seed)


def save_llava(
    path: Path,
    vision: dict,
    text: dict | None,
    image_size: int,
    patch: int,
    seed: int,
) -> Path:
    """A LLaVA of the given CLIP tower sizes (`vision`: hidden, intermediate, layers, heads)
    and Llama decoder (`text`: LlamaConfig arguments over the tiny decoder's; None: the tiny
    decoder), random weights, its processor (the fixture tokenizer with <image> added)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    tower = CLIPVisionConfig(
        **vision, image_size=image_size, patch_size=patch, projection_dim=vision["hidden_size"]
    )
    config = LlavaConfig(
        vision_config=tower,
        text_config=LlamaConfig(**{**tiny_config_kwargs(tokenizer), **(text or {})}),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(path)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="default",
        chat_template=VISION_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


PIXTRAL_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
PIXTRAL_PATCH, PIXTRAL_MERGE, PIXTRAL_LONGEST = 4, 2, 40  # 8 pixels a feature, <= 5x5 features
# Mistral 3's chat: an image part is [IMG], which the processor expands into rows of [IMG]
# ending in [IMG_BREAK], the last in [IMG_END]
PIXTRAL_CHAT_TEMPLATE = VISION_CHAT_TEMPLATE.replace("<image>", "[IMG]")


def save_tiny_mistral3(path: Path, seed: int = 13) -> Path:
    """A Mistral 3: a 2-layer Pixtral encoder (4x4 patches, images resized to at most 40
    pixels a side, 2x2 patches merged into one feature) and the tiny decoder as a Mistral,
    random weights; saved as a hub repo saves it: Pixtral's image processor config, the
    fixture tokenizer with Pixtral's three image tokens, and a `PixtralProcessor` config
    (which transformers cannot load without torchvision)."""
    import json

    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralImageProcessorPil,
        PixtralVisionConfig,
    )

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(PIXTRAL_TOKENS)})
    tokenizer.chat_template = PIXTRAL_CHAT_TEMPLATE
    vision = PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=16,
        image_size=PIXTRAL_LONGEST,
        patch_size=PIXTRAL_PATCH,
    )
    config = Mistral3Config(
        vision_config=vision,
        text_config=MistralConfig(**tiny_config_kwargs(tokenizer), sliding_window=None),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=PIXTRAL_MERGE,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(path)
    image_processor = PixtralImageProcessorPil(
        size={"longest_edge": PIXTRAL_LONGEST},
        patch_size={"height": PIXTRAL_PATCH, "width": PIXTRAL_PATCH},
    )
    image_processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    processor = {
        "processor_class": "PixtralProcessor",
        "patch_size": PIXTRAL_PATCH,
        "spatial_merge_size": PIXTRAL_MERGE,
        "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
    }
    (path / "processor_config.json").write_text(json.dumps(processor))
    (path / "chat_template.jinja").write_text(PIXTRAL_CHAT_TEMPLATE)
    return path


def pixtral_prompt_ids(tokenizer, text: str, image_sizes) -> list[int]:
    """A brute force of `PixtralProcessor`'s text: each [IMG] of `text` (in order) becomes
    its image's rows of [IMG] x columns + [IMG_BREAK], the last break [IMG_END]."""
    feature = PIXTRAL_PATCH * PIXTRAL_MERGE
    pieces = text.split("[IMG]")
    assert len(pieces) == len(image_sizes) + 1
    out = pieces[0]
    for (height, width), after in zip(image_sizes, pieces[1:], strict=True):
        rows = ["[IMG]" * (int(width) // feature) + "[IMG_BREAK]"] * (int(height) // feature)
        out += "".join(rows)[: -len("[IMG_BREAK]")] + "[IMG_END]" + after
    return tokenizer(out, add_special_tokens=False)["input_ids"]


GEMMA3_TOKENS_PER_IMAGE = 16

# Gemma's way: an image part is <start_of_image>, which the processor expands into
# "\n\n<start_of_image>" + the image's placeholders + "<end_of_image>\n\n"
GEMMA3_CHAT_TEMPLATE = VISION_CHAT_TEMPLATE.replace("<image>", "<start_of_image>")


def save_tiny_gemma3(path: Path, seed: int = 11, window: int = 12) -> Path:
    """A Gemma 3: a 2-layer SigLIP tower (32x32 images, 4x4 patches: 64 patches pooled to
    16 placeholders) and a 3-layer decoder (two sliding layers of `window` tokens, then a
    global one), random weights; its Gemma3Processor (Gemma3 image processor + the fixture
    tokenizer with the image tokens added) saved beside."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Gemma3TextConfig,
        PreTrainedTokenizerFast,
        SiglipVisionConfig,
    )

    base = build_tiny_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=base._tokenizer,
        bos_token=base.bos_token,
        eos_token=base.eos_token,
        unk_token=base.unk_token,
        pad_token=base.pad_token,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    text = {
        **tiny_config_kwargs(tokenizer),
        "head_dim": 16,
        "num_hidden_layers": 3,
        "sliding_window": window,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 16,
    }
    del text["tie_word_embeddings"]
    tower = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=4,
    )
    config = Gemma3Config(
        text_config=Gemma3TextConfig(**text),
        vision_config=tower,
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
        tie_word_embeddings=False,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(path)
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def random_image(seed: int, size: tuple[int, int] = (40, 50)):
    """An RGB PIL image of random pixels (width, height)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def image_message(question: str, images: int = 1) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image"}] * images + [{"type": "text", "text": question}],
        }
    ]


def processed(processor, question: str, images: list) -> dict:
    """The processor's output for a chat turn with `images` before `question`."""
    prompt = processor.apply_chat_template(
        image_message(question, len(images)), add_generation_prompt=True
    )
    return processor(images=images or None, text=prompt, return_tensors="pt")


def engine_prompt(tower, batch: dict) -> tuple[list[int], tuple]:
    """A processor output's prompt as the engine takes it: content ids at each image's
    placeholders, the images one by one (`VisionTower.split_processed`)."""
    from astrai_batch.engine.vision.image_inputs import image_prompt

    split = tower.split_processed(batch)
    extras = [more for _, more in split]
    return image_prompt(
        batch["input_ids"][0].tolist(),
        tower.image_token_id,
        [pixels for pixels, _ in split],
        tower.image_lengths(extras),
        extras=extras,
        split=tower.split_placeholders,
    )


def hf_vlm_greedy(model_dir: Path, inputs: list[dict], max_new_tokens: int) -> list[list[int]]:
    """transformers `generate` on each processor output alone, greedy, float32."""
    return [tokens for tokens, _ in hf_vlm_greedy_with_margins(model_dir, inputs, max_new_tokens)]


def hf_vlm_greedy_with_margins(
    model_dir: Path, inputs: list[dict], max_new_tokens: int, dtype: torch.dtype = torch.float32
) -> list[tuple[list[int], list[tuple[float, float]]]]:
    """`hf_vlm_greedy` in `dtype`, with each generated position's top two logits."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).eval()
    outputs = []
    with torch.inference_mode():
        for batch in inputs:
            batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
            out = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=model.config.text_config.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            tokens = out.sequences[0, batch["input_ids"].shape[1] :].tolist()
            top2 = [tuple(s[0].float().topk(2).values.tolist()) for s in out.scores]
            outputs.append((tokens, top2))
    return outputs


def image_chat_lines(rows) -> list[dict]:
    """OpenAI chat batch lines of (custom_id, question, image or None): the image, as a PNG
    data URL, before the question."""
    lines = []
    for custom_id, question, image in rows:
        content = [{"type": "text", "text": question}]
        if image is not None:
            content.insert(0, {"type": "image_url", "image_url": {"url": png_data_url(image)}})
        body = {"messages": [{"role": "user", "content": content}]}
        lines.append(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    return lines


def run_image_job(model_dir: Path, rows, tmp_path: Path, max_new: int) -> tuple[dict, dict]:
    """`astrai-batch run` on the OpenAI image lines of `rows` (`image_chat_lines`), tokens
    saved: (the output rows by id, the JSON summary)."""
    import json

    import pyarrow.parquet as pq
    from jobs.jobkit import run_cli, write_jsonl

    output = tmp_path / "out.parquet"
    result = run_cli(
        "run", write_jsonl(tmp_path / "in.jsonl", image_chat_lines(rows)), output,
        "--model", model_dir, "--max-tokens", max_new, "--kv-cache-memory", "8MiB",
        "--save-tokens", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    got = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    return got, json.loads(result.stdout.strip().splitlines()[-1])


def png_data_url(image) -> str:
    """A PIL image as a `data:image/png;base64,...` URL (what OpenAI image parts carry)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
