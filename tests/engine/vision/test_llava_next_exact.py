"""A tiny LLaVA-NeXT runs token-exact against transformers `generate` on the same processor
output, under the default (invariant) numerics: images of different sizes (each its own
anyres grid, unpadded features and newlines, so its own placeholder count), two images in a
row, text after them, prefills split mid-image; batch-invariant (a row's logits the same
bits alone as in a crowd); a repeated image served from the prefix cache, encoded once."""

from __future__ import annotations

import pytest
import torch
from invariance_kit import assert_alone_equals_crowds, run_one_after_another
from llava_next_kit import save_tiny_llava_next
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
from astrai_batch.engine.vision.llava_next_tower import LlavaNextTower
from astrai_batch.io.image_sources import ImageLimits, ImageRef
from astrai_batch.jobs.planning.image_encoding import encode_image_row, weightless_tower

MAX_NEW = 8


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    model_dir = save_tiny_llava_next(tmp_path_factory.mktemp("llava_next"))
    return model_dir, load_model(model_dir)


def engine_request(loaded, request_id, batch, params):
    ids, images = engine_prompt(loaded.vision, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def test_placeholder_counts_equal_the_processors(llava_next):
    """Each image size's count (grid by pinpoints, unpadded rows and columns, newlines) is
    the number of image tokens the processor writes for it."""
    _, loaded = llava_next
    tower = loaded.vision
    assert isinstance(tower, LlavaNextTower)
    processor = tower.processor
    sizes = [(w, h) for w in (7, 24, 32, 33, 50, 64, 100, 301) for h in (9, 32, 40, 64, 97)]
    counts = set()
    for width, height in sizes:
        batch = processed(processor, "?", [random_image(0, (width, height))])
        want = int((batch["input_ids"] == tower.image_token_id).sum())
        (_, extras), *_ = tower.split_processed(batch)
        assert tower.image_lengths([extras]) == [want], (width, height)
        counts.add(want)
    assert len(counts) > 5


def test_greedy_tokens_equal_transformers_alone_and_in_a_crowd(llava_next):
    model_dir, loaded = llava_next
    processor = loaded.vision.processor
    wide, tall = random_image(1, (100, 60)), random_image(2, (24, 56))
    inputs = [
        processed(processor, "What is in this picture?", [wide]),
        processed(processor, "Describe it.", [tall]),
        processed(processor, "Compare the two, then say which is larger.", [wide, tall]),
        processed(processor, "No image here, just text.", []),
    ]
    # the processor pads the pair's tiles to the wide image's 5; the tall one has 3
    assert [b["pixel_values"].shape[1] for b in inputs[:3]] == [5, 3, 5]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)]
    assert [len(r.images) for r in requests] == [1, 1, 2, 0]
    assert requests[0].images[0].length != requests[1].images[0].length
    # each image the same input (key, tiles) alone and beside another
    keys = [image.key for image in requests[2].images]
    assert keys == [requests[0].images[0].key, requests[1].images[0].key]
    # small steps: prefills split mid-image (chunked prefill keeps the image's features)
    config = EngineConfig(page_size=8, num_pages=128, max_num_batched_tokens=24)
    results, stats = generate_sync(loaded, requests, config)
    for i, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.finish_reason in ("stop", "length"), result.error
        assert list(result.token_ids) == want, f"row {i}"
    assert stats.images_encoded == 2  # 4 images in the rows, 2 distinct


def test_an_images_features_are_transformers_bits_alone_and_in_a_pair(llava_next):
    """One image per encoder call gives the bits of transformers' `get_image_features` on
    that image alone, and (this tiny CPU model) on the pair of images the processor pads
    together: transformers' tower batches every tile of the prompt."""
    _, loaded = llava_next
    tower = loaded.vision
    images = [random_image(3, (100, 60)), random_image(4, (24, 56))]
    pair = processed(tower.processor, "?", images)
    model = tower.vlm.model
    with torch.inference_mode():
        together = model.get_image_features(
            pair["pixel_values"], pair["image_sizes"], return_dict=True
        ).pooler_output
        for image, theirs in zip(engine_prompt(tower, pair)[1], together, strict=True):
            alone = model.get_image_features(
                image.pixel_values, image.extras[0], return_dict=True
            ).pooler_output[0]
            ours = tower.encode(image)
            assert torch.equal(ours, alone)
            assert torch.equal(ours, theirs)


def test_image_rows_are_batch_invariant(llava_next):
    """Each watched row alone (no prefix cache) and in a crowd of image and text rows under
    two token budgets, the prefix cache on: every generated position's logits torch.equal."""
    _, loaded = llava_next
    processor = loaded.vision.processor
    images = [random_image(seed, (24 + 20 * seed, 40)) for seed in range(3)]
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
    for stats in assert_alone_equals_crowds(loaded, requests, watched, (16, 512), pages=96):
        assert stats.images_encoded == 3  # once each per engine


def test_a_repeated_image_is_read_from_the_prefix_cache(llava_next):
    """The second row (same text before the same image, another question right after it)
    reads the image's pages from the cache, the image encoded once, and gives transformers'
    tokens."""
    model_dir, loaded = llava_next
    processor = loaded.vision.processor
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
    core = EngineCore(loaded, EngineConfig(page_size=4, num_pages=96))
    results = run_one_after_another(core, (first, second))
    # every full page up to the image's end (the question after it differs)
    assert results[1].cached_tokens >= image_end - image_end % 4 >= first.images[0].length
    assert [list(r.token_ids) for r in results] == expected
    assert core.stats().images_encoded == 1


def test_a_jobs_image_row_is_the_processors_prompt_and_runs_exactly(llava_next):
    """A chat row's images as a job prepares them (each image through the image processor
    alone, its image_sizes kept beside its pixels, pixels loaded again when the request
    arrives): the processor's token ids, each image's own placeholder count, the same
    prompt from `plan`'s weightless tower, and transformers' tokens."""
    model_dir, loaded = llava_next
    tower = loaded.vision
    processor = tower.processor
    images = [random_image(5, (100, 60)), random_image(6, (24, 56))]
    text = processor.apply_chat_template(image_message("Compare.", 2), add_generation_prompt=True)
    refs = [ImageRef(url=png_data_url(image)) for image in images]
    encoded = encode_image_row(tower, "tiny", text, refs, ImageLimits())
    assert not isinstance(encoded, str), encoded
    ids, inputs = encoded
    reference = processed(processor, "Compare.", images)
    assert [tower.image_token_id if t < 0 else t for t in ids] == reference["input_ids"][0].tolist()
    assert [image.length for image in inputs] == [52, 56]
    assert all(image.pixel_values is None for image in inputs)  # loaded by the engine
    # `plan`'s tower (config and processor, no weights) writes the same prompt
    planned = encode_image_row(weightless_tower(str(model_dir)), "tiny", text, refs, ImageLimits())
    assert planned[0] == ids and [i.key for i in planned[1]] == [i.key for i in inputs]
    request = GenerationRequest(0, ids, SamplingParams(max_tokens=MAX_NEW), images=inputs)
    results, _ = generate_sync(loaded, [request], EngineConfig(page_size=8, num_pages=64))
    assert [list(results[0].token_ids)] == hf_vlm_greedy(model_dir, [reference], MAX_NEW)
