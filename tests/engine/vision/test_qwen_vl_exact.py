"""Tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL (its DeepStack features too) run token-exact
against transformers `generate` on the same processor output, under the default
(invariant) numerics: images of different sizes (each its own grid and placeholder count),
two images in a row, text after them, prefills split mid-image; batch-invariant (a row's
logits the same bits alone as in a crowd); a repeated image served from the prefix cache
with its M-RoPE positions intact."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from invariance_kit import assert_alone_equals_crowds, run_one_after_another
from qwen_vl_kit import qwen_vl_processor, save_tiny_qwen_vl
from vision_kit import (
    engine_prompt,
    hf_vlm_greedy,
    image_message,
    png_data_url,
    processed,
    random_image,
)

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.vision.qwen_vl_tower import QwenVLTower
from astrai_batch.io.image_sources import ImageLimits, ImageRef
from astrai_batch.jobs.planning.image_encoding import encode_image_row

MAX_NEW = 8


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def qwen_vl(request, tmp_path_factory):
    model_dir = save_tiny_qwen_vl(tmp_path_factory.mktemp(request.param), request.param)
    return model_dir, load_model(model_dir), qwen_vl_processor(request.param)


def engine_request(loaded, request_id, batch, params):
    ids, images = engine_prompt(loaded.vision, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def test_greedy_tokens_equal_transformers_alone_and_in_a_crowd(qwen_vl):
    model_dir, loaded, processor = qwen_vl
    wide, tall = random_image(1, (100, 60)), random_image(2, (24, 56))
    inputs = [
        processed(processor, "What is in this picture?", [wide]),
        processed(processor, "Describe it.", [tall]),
        processed(processor, "Compare the two, then say which is larger.", [wide, tall]),
        processed(processor, "No image here, just text.", []),
    ]
    grids = [b["image_grid_thw"].tolist() for b in inputs[:3]]
    assert grids[0] != grids[1]  # the two images take different grids and token counts
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)]
    assert [len(r.images) for r in requests] == [1, 1, 2, 0]
    assert requests[0].images[0].length != requests[1].images[0].length
    # small steps: prefills split mid-image (chunked prefill keeps the image's features)
    config = EngineConfig(page_size=8, num_pages=96, max_num_batched_tokens=12)
    results, stats = generate_sync(loaded, requests, config)
    for i, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.finish_reason in ("stop", "length"), result.error
        assert list(result.token_ids) == want, f"row {i}"
    assert stats.images_encoded == 2  # 4 images in the rows, 2 distinct


def test_image_rows_are_batch_invariant(qwen_vl):
    """Each watched row alone (no prefix cache) and in a crowd of image and text rows under
    two token budgets, the prefix cache on: every generated position's logits torch.equal."""
    _, loaded, processor = qwen_vl
    images = [random_image(seed, (24 + 8 * seed, 40)) for seed in range(3)]
    greedy = SamplingParams(max_tokens=5, ignore_eos=True)
    sampled = SamplingParams(max_tokens=5, temperature=0.8, ignore_eos=True)
    questions = ["What is it?", "Name the colours.", "Count things."]
    inputs = [
        processed(processor, questions[i % 3], [images[i % 3]] if i % 4 else []) for i in range(8)
    ]
    inputs.append(processed(processor, "Both?", images[:2]))
    requests = [
        engine_request(loaded, i, b, sampled if i % 2 else greedy) for i, b in enumerate(inputs)
    ]
    watched = [2, 5, 4, 8]  # one and two images, a text row, greedy and sampled
    assert_alone_equals_crowds(loaded, requests, watched, (16, 512))


def test_a_repeated_image_is_read_from_the_prefix_cache(qwen_vl):
    """The second row (same text before the same image, another question after) reads the
    image's pages from the cache and still gives transformers' tokens: its positions after
    the image continue from the image's M-RoPE positions, not from its token count."""
    model_dir, loaded, processor = qwen_vl
    photo = random_image(11, (48, 40))
    inputs = [
        processed(processor, "What is shown?", [photo]),
        processed(processor, "Which colour dominates?", [photo]),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    first, second = (engine_request(loaded, i, b, params) for i, b in enumerate(inputs))
    image_end = first.images[0].end
    assert list(first.prompt_token_ids[:image_end]) == list(second.prompt_token_ids[:image_end])
    core = EngineCore(loaded, EngineConfig(page_size=4, num_pages=64))
    results = run_one_after_another(core, (first, second))
    assert results[1].cached_tokens >= image_end
    assert [list(r.token_ids) for r in results] == expected
    assert core.stats().images_encoded == 1


def test_mrope_positions_equal_transformers_get_rope_index(qwen_vl):
    """The positions the runner feeds, for any split of a prompt into chunks and for the
    decode tokens after it, are transformers' `get_rope_index` and its `rope_deltas`."""
    _, loaded, processor = qwen_vl
    vlm = loaded.vision.vlm
    images = [random_image(3, (100, 60)), random_image(4, (24, 56))]
    for batch in (
        processed(processor, "Compare the two.", images),
        processed(processor, "Describe.", images[1:]),
    ):
        positions, deltas = vlm.model.get_rope_index(
            batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"]
        )
        ids, inputs = engine_prompt(loaded.vision, batch)
        length = len(ids)
        decode = torch.arange(length, length + 3).expand(3, -1) + deltas[0]
        want = torch.cat([positions[:, 0], decode], dim=1)
        for cut in (1, 7, inputs[0].offset + 5, length - 1):
            chunks = [
                ScheduledChunk(ids[:cut], 0, (), False, images=inputs),
                ScheduledChunk(ids[cut:], cut, (), True, images=inputs),
                ScheduledChunk([0, 0], length, (), True, images=inputs),  # decode
                ScheduledChunk([0], length + 2, (), True, images=inputs),
            ]
            got = loaded.vision.rope_positions(chunks)
            assert torch.equal(torch.from_numpy(got), want), cut


def test_text_only_steps_keep_plain_positions(qwen_vl):
    """A step with no image rows feeds the model its tokens' own positions (None: the text
    model's path, decode graphs allowed)."""
    _, loaded, _ = qwen_vl
    assert loaded.vision.rope_positions([ScheduledChunk([5, 6, 7], 4, (), True)]) is None


def test_a_jobs_image_row_is_the_processors_prompt_and_runs_exactly(qwen_vl):
    """A chat row's images as a job prepares them (each image through the image processor
    alone, its grid kept beside its pixels, pixels loaded again when the request arrives):
    the processor's token ids, each image's own placeholder count, and transformers'
    tokens. (The loaded model has no processor here: transformers' Qwen-VL processor
    needs torchvision for its video part; the test's processor is the same class without
    it.)"""
    model_dir, loaded, processor = qwen_vl
    tower = QwenVLTower(loaded.vision.vlm, processor)
    images = [random_image(5, (100, 60)), random_image(6, (24, 56))]
    text = processor.apply_chat_template(image_message("Compare.", 2), add_generation_prompt=True)
    refs = [ImageRef(url=png_data_url(image)) for image in images]
    encoded = encode_image_row(tower, "tiny", text, refs, ImageLimits())
    assert not isinstance(encoded, str), encoded
    ids, inputs = encoded
    reference = processed(processor, "Compare.", images)
    assert [tower.image_token_id if t < 0 else t for t in ids] == reference["input_ids"][0].tolist()
    assert [image.length for image in inputs] == [24, 8]
    assert all(image.pixel_values is None for image in inputs)  # loaded by the engine
    request = GenerationRequest(0, ids, SamplingParams(max_tokens=MAX_NEW), images=inputs)
    results, _ = generate_sync(loaded, [request], EngineConfig(page_size=8, num_pages=64))
    assert [list(results[0].token_ids)] == hf_vlm_greedy(model_dir, [reference], MAX_NEW)


def test_an_image_without_its_grid_or_with_another_count_is_the_rows_error(qwen_vl):
    _, loaded, processor = qwen_vl
    batch = processed(processor, "What is it?", [random_image(7, (100, 60))])
    ids, (image,) = engine_prompt(loaded.vision, batch)
    params = SamplingParams(max_tokens=2)
    no_grid = dataclasses.replace(image, extras=())
    other_grid = dataclasses.replace(image, extras=(torch.tensor([[1, 4, 4]]),))
    results, _ = generate_sync(
        loaded,
        [
            GenerationRequest(0, ids, params, images=(no_grid,)),
            GenerationRequest(1, ids, params, images=(other_grid,)),
        ],
        EngineConfig(page_size=8, num_pages=32),
    )
    assert [r.error for r in results] == [
        "a Qwen-VL image needs its image_grid_thw (1 x 3)",
        "an image takes 4 placeholder tokens with this model",
    ]
