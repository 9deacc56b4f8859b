"""A tiny Mistral 3 (Pixtral encoder, patch merger, Mistral decoder) runs token-exact against
transformers `generate` under the default (invariant) numerics: images at their own aspect
(rows of [IMG] broken by [IMG_BREAK], ending in [IMG_END]: one image, several runs), two
images in a row, prefills cut inside an image's rows; batch-invariant; a repeated image read
from the prefix cache and encoded once; a job's OpenAI image lines through `astrai-batch run`.

transformers' `PixtralProcessor` needs torchvision, which the CPU setup lacks: the engine
builds the same processing from transformers' Pillow image processor
(`engine/vision/pixtral_processor.py`), checked here against a brute force of the rule."""

from __future__ import annotations

import pytest
import torch
from invariance_kit import assert_alone_equals_crowds, run_one_after_another
from vision_kit import (
    PIXTRAL_CHAT_TEMPLATE,
    engine_prompt,
    hf_vlm_greedy,
    image_message,
    pixtral_prompt_ids,
    random_image,
    run_image_job,
    save_tiny_mistral3,
)

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.vision.pixtral_processor import PixtralPilProcessor

MAX_NEW = 8


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory):
    model_dir = save_tiny_mistral3(tmp_path_factory.mktemp("mistral3"))
    loaded = load_model(model_dir)
    return model_dir, loaded, loaded.vision


def reference(tower, question: str, images: list) -> dict:
    """transformers' inputs for a chat turn: the Pillow image processor's tensors and the
    brute-forced prompt ids (what `PixtralProcessor` would give)."""
    processor = tower.processor
    text = processor.apply_chat_template(
        image_message(question, len(images)), add_generation_prompt=True, tokenize=False
    )
    batch = {}
    sizes = []
    if images:
        out = processor.image_processor(images=images, return_tensors="pt")
        batch["pixel_values"] = out["pixel_values"]
        batch["image_sizes"] = torch.as_tensor(out["image_sizes"])
        sizes = batch["image_sizes"].tolist()
    ids = pixtral_prompt_ids(processor.tokenizer, text, sizes)
    batch["input_ids"] = torch.tensor([ids])
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


def engine_request(tower, request_id, batch, params):
    ids, images = engine_prompt(tower, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def test_the_processor_is_pixtrals_rule_from_transformers_parts(mistral3):
    _, _, tower = mistral3
    processor = tower.processor
    assert isinstance(processor, PixtralPilProcessor)
    assert processor.chat_template == PIXTRAL_CHAT_TEMPLATE
    wide, tall = random_image(1, (40, 24)), random_image(2, (12, 36))
    text = "Look: [IMG] and [IMG]."
    got = processor(images=[wide, tall], text=text, add_special_tokens=False)
    # 40 x 24 stays (longest edge 40): 3 rows of 5; 12 x 36: 36 x 16 after rounding up to
    # whole 8-pixel features: 5 rows of 2
    assert got["image_sizes"].tolist() == [[24, 40], [40, 16]]
    assert got["input_ids"][0] == pixtral_prompt_ids(
        processor.tokenizer, text, got["image_sizes"].tolist()
    )
    with pytest.raises(ValueError, match=r"^the text has 1 \[IMG\] tokens for 2 images$"):
        processor(images=[wide, tall], text="[IMG]")


def test_greedy_tokens_equal_transformers_alone_and_in_a_crowd(mistral3):
    model_dir, loaded, tower = mistral3
    wide, tall = random_image(3, (40, 24)), random_image(4, (20, 40))
    inputs = [
        reference(tower, "What is in this picture?", [wide]),
        reference(tower, "Describe it.", [tall]),
        reference(tower, "Compare the two, then say which is larger.", [wide, tall]),
        reference(tower, "No image here, just text.", []),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(tower, i, b, params) for i, b in enumerate(inputs)]
    assert [[len(image.spans) for image in r.images] for r in requests] == [[3], [5], [3, 5], []]
    assert requests[0].images[0].length == 15
    # small steps: prefills cut inside an image's rows and between them
    config = EngineConfig(page_size=8, num_pages=128, max_num_batched_tokens=7)
    results, stats = generate_sync(loaded, requests, config)
    for i, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.finish_reason in ("stop", "length"), result.error
        assert list(result.token_ids) == want, f"row {i}"
    assert stats.images_encoded == 2  # 3 images in the rows, 2 distinct


def test_image_rows_are_batch_invariant(mistral3):
    _, loaded, tower = mistral3
    images = [random_image(seed, (16 + 8 * seed, 40 - 6 * seed)) for seed in range(3)]
    greedy = SamplingParams(max_tokens=5, ignore_eos=True)
    sampled = SamplingParams(max_tokens=5, temperature=0.8, ignore_eos=True)
    questions = ["What is it?", "Name the colours.", "Count things."]
    inputs = [
        reference(tower, questions[i % 3], [images[i % 3]] if i % 4 else []) for i in range(8)
    ]
    inputs.append(reference(tower, "Both?", images[1:]))
    requests = [
        engine_request(tower, i, b, sampled if i % 2 else greedy) for i, b in enumerate(inputs)
    ]
    assert_alone_equals_crowds(loaded, requests, [2, 5, 4, 8], (9, 512), pages=96)


def test_a_repeated_image_is_read_from_the_prefix_cache(mistral3):
    model_dir, loaded, tower = mistral3
    photo = random_image(11, (32, 24))
    inputs = [
        reference(tower, "What is shown?", [photo]),
        reference(tower, "Which colour dominates?", [photo]),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    first, second = (engine_request(tower, i, b, params) for i, b in enumerate(inputs))
    image = first.images[0]
    assert list(first.prompt_token_ids[: image.end]) == list(second.prompt_token_ids[: image.end])
    core = EngineCore(loaded, EngineConfig(page_size=2, num_pages=192))
    results = run_one_after_another(core, (first, second))
    assert results[1].cached_tokens >= image.end
    assert [list(r.token_ids) for r in results] == expected
    stats = core.stats()
    assert stats.images_encoded == 1
    assert stats.image_tokens_cached >= image.length


def test_a_cli_job_runs_image_lines_exactly(mistral3, tmp_path):
    model_dir, _, tower = mistral3
    photo, wide = random_image(31, (32, 40)), random_image(32, (40, 16))
    rows = [
        ("a", "What is shown?", photo),
        ("b", "Describe the picture.", wide),
        ("c", "What is shown? Briefly.", photo),
        ("t", "Just text.", None),
    ]
    got, summary = run_image_job(model_dir, rows, tmp_path, MAX_NEW)
    inputs = [reference(tower, q, [image] if image else []) for _, q, image in rows]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    for (custom_id, *_), want in zip(rows, expected, strict=True):
        assert got[custom_id]["completion_token_ids"] == want, custom_id
    assert summary["images_encoded"] == 2
