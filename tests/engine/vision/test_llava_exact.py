"""A tiny LLaVA runs token-exact against transformers `generate` on the same processor
output, under the default (invariant) numerics, and batch-invariant: a row's logits are the
same bits alone as beside other image and text rows, whatever chunking its prefill gets."""

from __future__ import annotations

import pytest
from invariance_kit import assert_alone_equals_crowds
from vision_kit import (
    TOKENS_PER_IMAGE,
    engine_prompt,
    hf_vlm_greedy,
    processed,
    random_image,
    save_tiny_llava,
)

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model

MAX_NEW = 8


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    model_dir = save_tiny_llava(tmp_path_factory.mktemp("llava"))
    return model_dir, load_model(model_dir)


def engine_request(loaded, request_id, batch, params):
    ids, images = engine_prompt(loaded.vision, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def test_greedy_tokens_equal_transformers_alone_and_in_a_crowd(llava):
    model_dir, loaded = llava
    processor = loaded.vision.processor
    assert loaded.vision.tokens_per_image == TOKENS_PER_IMAGE
    cat, dog = random_image(1), random_image(2, (64, 32))
    inputs = [
        processed(processor, "What is in this picture?", [cat]),
        processed(processor, "Describe it.", [dog]),
        processed(processor, "What is in this picture?", [dog]),
        processed(processor, "Compare the two.", [cat, dog]),
        processed(processor, "No image here, just text.", []),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)]
    # small steps: prefills split mid-image (chunked prefill keeps the image's features)
    config = EngineConfig(page_size=8, num_pages=96, max_num_batched_tokens=24)
    results, stats = generate_sync(loaded, requests, config)
    for i, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.finish_reason in ("stop", "length"), result.error
        assert list(result.token_ids) == want, f"row {i}"
    # 5 images in the rows, 2 distinct: each encoded once
    assert stats.images_encoded == 2
    assert stats.image_encodes_saved >= 3


def test_image_rows_are_batch_invariant(llava):
    """Each watched row alone (no prefix cache) and in a crowd of image and text rows under
    two token budgets, the prefix cache on: every generated position's logits torch.equal."""
    _, loaded = llava
    processor = loaded.vision.processor
    images = [random_image(seed, (30 + 7 * seed, 40)) for seed in range(4)]
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True)
    questions = ["What is it?", "Name the colours in the picture.", "Count things."]
    inputs = [
        processed(processor, questions[i % 3], [images[i % 4]] if i % 5 else []) for i in range(12)
    ]
    requests = [
        engine_request(loaded, i, b, sampled if i % 2 else greedy) for i, b in enumerate(inputs)
    ]
    watched = [2, 5, 7]  # image rows and a text row, greedy and sampled
    for stats in assert_alone_equals_crowds(loaded, requests, watched, (16, 512)):
        assert stats.images_encoded == 4  # once each per engine
