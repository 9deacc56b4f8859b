"""Images in the prefix cache: two rows with the same text before the same image share its
pages (the second row's cached tokens cover the image's placeholders) and the vision tower
runs once; a different image shares nothing past the text before it; the encoder cache
stays within its budget."""

from __future__ import annotations

import pytest
import torch
from vision_kit import TOKENS_PER_IMAGE, engine_prompt, processed, random_image, save_tiny_llava

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.vision.encoder_cache import EncoderCache
from astrai_batch.engine.vision.image_inputs import (
    ImageInput,
    image_prompt,
    pixel_key,
    placeholder_ids,
)
from astrai_batch.errors import ConfigError

PARAMS = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(save_tiny_llava(tmp_path_factory.mktemp("llava")))


def request(loaded, request_id, question, images):
    batch = processed(loaded.vision.processor, question, images)
    ids, inputs = engine_prompt(loaded.vision, batch)
    return GenerationRequest(request_id, ids, PARAMS, images=inputs)


def run_one_by_one(loaded, requests, page_size=4):
    """The requests in turn on one engine (each finishes before the next arrives)."""
    from astrai_batch.engine.core import EngineCore

    core = EngineCore(loaded, EngineConfig(page_size=page_size, num_pages=64))
    results = []
    for req in requests:
        assert core.add_request(req) == []
        while core.num_unfinished:
            results.extend(core.step())
    core.check_invariants()
    return results, core.stats()


def test_same_image_same_text_before_shares_the_image_pages(loaded):
    photo = random_image(11)
    first = request(loaded, 0, "What is shown?", [photo])
    second = request(loaded, 1, "Which colour dominates?", [photo])
    image_end = first.images[0].end
    assert first.images[0].key == second.images[0].key
    assert list(first.prompt_token_ids[:image_end]) == list(second.prompt_token_ids[:image_end])
    results, stats = run_one_by_one(loaded, [first, second])
    assert results[1].cached_tokens >= image_end >= TOKENS_PER_IMAGE
    assert stats.images_encoded == 1  # the second row's image came from the prefix cache
    assert stats.image_encodes_saved == 0  # ... so not even its features were looked up
    assert stats.image_tokens_cached == TOKENS_PER_IMAGE


def test_another_image_shares_nothing_past_the_text_before_it(loaded):
    photo, other = random_image(11), random_image(12)
    base = request(loaded, 0, "What is shown?", [photo])
    image_start = base.images[0].offset
    different_image = request(loaded, 1, "What is shown?", [other])
    results, stats = run_one_by_one(loaded, [base, different_image])
    assert results[1].cached_tokens <= image_start  # the text before the image only
    assert stats.images_encoded == 2
    assert stats.image_tokens_cached == 0


def test_encoder_cache_serves_a_repeated_image_within_its_budget():
    calls = []

    def encode(image):
        calls.append(image.key)
        return torch.zeros(image.length, 8)

    def image(seed):
        pixels = torch.full((1, 3, 4, 4), float(seed))
        return ImageInput(pixel_key(pixels), 0, 4, pixels)

    row_bytes = 4 * 8 * 4  # 4 features of 8 float32
    cache = EncoderCache(encode, max_bytes=2 * row_bytes)
    a, b, c = image(1), image(2), image(3)
    cache.features(a, finishes=True)
    cache.features(a, finishes=True)
    assert (cache.counts.encoded, cache.counts.reused) == (1, 1)
    cache.features(b, finishes=False)  # pinned: its prefill goes on in a later step
    cache.features(c, finishes=True)
    cache.features(c, finishes=True)
    cache.check_invariants()
    assert cache.bytes_held <= cache.max_bytes
    cache.features(b, finishes=True)  # still held although the least recently used
    assert calls == [a.key, b.key, c.key]
    cache.features(a, finishes=True)  # evicted for c: encoded again
    assert calls[-1] == a.key and cache.counts.encoded == 4
    cache.check_invariants()


def test_content_ids_name_the_pixels():
    pixels = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    same = pixels.clone()
    changed = pixels.clone()
    changed[0, 0, 0, 0] += 1e-6
    assert pixel_key(pixels) == pixel_key(same) != pixel_key(changed)
    assert pixel_key(pixels) != pixel_key(pixels.to(torch.float64))
    ids = placeholder_ids(pixel_key(pixels), 20)
    assert all(i < 0 for i in ids) and len(set(ids)) == 8
    with pytest.raises(ValueError, match="3 image tokens where 1 images take 4"):
        image_prompt([5, 9, 9, 9, 6], 9, [pixels], [4])
    with pytest.raises(ValueError, match="not consecutive"):
        image_prompt([5, 9, 9, 6, 9, 9], 9, [pixels], [4])
    # a family whose image is several runs (Idefics3's crops): one image, its ids in order
    split, (image,) = image_prompt([5, 9, 9, 6, 9, 9], 9, [pixels], [4], split=True)
    assert image.runs == ((1, 2), (4, 2)) and image.end == 6
    assert split == [5, *ids[:2], 6, *ids[2:4]]
    assert [image.placeholders_before(p) for p in (1, 3, 4, 5, 6)] == [0, 2, 2, 3, 4]


def test_the_engine_option_bounds_the_encoder_cache(loaded):
    """encoder_cache_memory=0 keeps no features: a repeated image (prefix cache off) is
    encoded again; the default keeps it."""
    photo = random_image(13)
    rows = [request(loaded, i, "What is shown?", [photo]) for i in range(2)]
    for memory, encoded in ((0, 2), (2**20, 1)):
        config = EngineConfig(
            page_size=4, num_pages=64, enable_prefix_cache=False, encoder_cache_memory=memory
        )
        _, stats = generate_sync(loaded, rows, config)
        assert stats.images_encoded == encoded
        assert stats.images_encoded + stats.image_encodes_saved == 2
    with pytest.raises(ConfigError, match="encoder_cache_memory must be a non-negative int"):
        EngineConfig(encoder_cache_memory=-1)
