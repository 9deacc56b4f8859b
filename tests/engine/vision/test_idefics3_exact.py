"""Tiny Idefics3 and SmolVLM run token-exact against transformers `generate` on the same
processor output, under the default (invariant) numerics: images split into crops plus the
global image (their placeholders one run per frame, text between runs) and unsplit, two
images of different sizes in a row, text after them, prefills cut mid-image and mid-run;
batch-invariant (a row's logits the same bits alone as in a crowd); a repeated image read
from the prefix cache and encoded once; a job's image row as the processor writes it."""

from __future__ import annotations

import pytest
import torch
from idefics3_kit import FRAME_TOKENS, idefics3_processor, save_tiny_idefics3
from invariance_kit import assert_alone_equals_crowds, run_one_after_another
from vision_kit import (
    engine_prompt,
    hf_vlm_greedy,
    image_message,
    png_data_url,
    processed,
    random_image,
    run_image_job,
)

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.vision.idefics3_tower import Idefics3Tower
from astrai_batch.engine.vision.image_inputs import check_image_prompt
from astrai_batch.io.image_sources import ImageLimits, ImageRef
from astrai_batch.jobs.planning.image_encoding import encode_image_row

MAX_NEW = 8


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def idefics3(request, tmp_path_factory):
    """(model dir, loaded model, a tower with the test's processor, split and unsplit
    processors). SmolVLM's directory has no processor transformers can load here (its own
    needs num2words): its tower's processor is None, so tests split prompts with their own."""
    model_dir = save_tiny_idefics3(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(model_dir)
    split = idefics3_processor(request.param)
    tower = Idefics3Tower(loaded.vision.vlm, split)
    return model_dir, loaded, tower, split, idefics3_processor(request.param, splitting=False)


def engine_request(tower, request_id, batch, params):
    ids, images = engine_prompt(tower, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def test_greedy_tokens_equal_transformers_alone_and_in_a_crowd(idefics3):
    model_dir, loaded, tower, split, whole = idefics3
    square, wide = random_image(1, (40, 50)), random_image(2, (100, 30))
    inputs = [
        processed(split, "What is in this picture?", [square]),  # 2 x 2 crops + global
        processed(split, "Describe it.", [wide]),  # 1 x 2 crops + global
        processed(split, "Compare the two, then say which is larger.", [square, wide]),
        processed(whole, "What is in this picture?", [square]),  # the global image alone
        processed(split, "No image here, just text.", []),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(tower, i, b, params) for i, b in enumerate(inputs)]
    frames = [[len(image.spans) for image in r.images] for r in requests]
    assert frames == [[5], [3], [5, 3], [1], []]
    assert requests[0].images[0].length == 5 * FRAME_TOKENS
    # small steps: prefills cut inside a frame's run and between an image's runs
    config = EngineConfig(page_size=8, num_pages=128, max_num_batched_tokens=12)
    results, stats = generate_sync(loaded, requests, config)
    for i, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.finish_reason in ("stop", "length"), result.error
        assert list(result.token_ids) == want, f"row {i}"
    assert stats.images_encoded == 3  # 5 images in the rows, 3 distinct pixel tensors


def test_image_rows_are_batch_invariant(idefics3):
    """Each watched row alone (no prefix cache) and in a crowd of image and text rows under
    two token budgets, the prefix cache on: every generated position's logits torch.equal."""
    _, loaded, tower, split, whole = idefics3
    images = [random_image(seed, (30 + 20 * seed, 40)) for seed in range(3)]
    greedy = SamplingParams(max_tokens=5, ignore_eos=True)
    sampled = SamplingParams(max_tokens=5, temperature=0.8, ignore_eos=True)
    questions = ["What is it?", "Name the colours.", "Count things."]
    inputs = [
        processed(split if i % 3 else whole, questions[i % 3], [images[i % 3]] if i % 4 else [])
        for i in range(8)
    ]
    inputs.append(processed(split, "Both?", images[1:]))
    requests = [
        engine_request(tower, i, b, sampled if i % 2 else greedy) for i, b in enumerate(inputs)
    ]
    watched = [2, 5, 4, 8]  # one and two split images, a text row, greedy and sampled
    # 24: chunks cut inside runs and between them
    assert_alone_equals_crowds(loaded, requests, watched, (24, 512), pages=96)


def test_a_repeated_image_is_read_from_the_prefix_cache(idefics3):
    """The second row (same text before the same split image, another question after) reads
    the image's pages, crops and the text between them, from the cache, encodes nothing,
    and still gives transformers' tokens."""
    model_dir, loaded, tower, split, _ = idefics3
    photo = random_image(11, (48, 40))
    inputs = [
        processed(split, "What is shown?", [photo]),
        processed(split, "Which colour dominates?", [photo]),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    first, second = (engine_request(tower, i, b, params) for i, b in enumerate(inputs))
    image = first.images[0]
    assert len(image.spans) == 5
    assert list(first.prompt_token_ids[: image.end]) == list(second.prompt_token_ids[: image.end])
    core = EngineCore(loaded, EngineConfig(page_size=2, num_pages=192))
    results = run_one_after_another(core, (first, second))
    assert results[1].cached_tokens >= image.end
    assert [list(r.token_ids) for r in results] == expected
    stats = core.stats()
    assert stats.images_encoded == 1
    assert stats.image_tokens_cached >= image.placeholders_before(image.end) == image.length


def test_content_ids_mark_every_run_of_an_image(idefics3):
    """Each frame's run carries its slice of the image's content ids; a prompt whose later
    run lost them is refused, and the text between runs is not counted as the image's."""
    _, _, tower, split, _ = idefics3
    ids, images = engine_prompt(tower, processed(split, "Hi", [random_image(3, (100, 30))]))
    (image,) = images
    assert check_image_prompt(ids, images) is None
    (first, _), (last, count) = image.spans[0], image.spans[-1]
    assert image.placeholders_before(last) == image.length - count
    between = ids[first + FRAME_TOKENS : image.spans[1][0]]
    assert between and all(t >= 0 for t in between)  # <fake_token_around_image><row_1_col_2>
    broken = list(ids)
    broken[last] = tower.image_token_id
    assert check_image_prompt(broken, images) == (
        "an image's placeholder tokens do not carry its content ids"
    )


def test_a_jobs_image_row_is_the_processors_prompt_and_runs_exactly(idefics3):
    """A chat row's images as a job prepares them (each image through the image processor
    alone, its frame count kept beside its pixels, pixels loaded again when the request
    arrives): the processor's token ids, each image's runs, and transformers' tokens."""
    model_dir, loaded, tower, split, _ = idefics3
    images = [random_image(5, (100, 30)), random_image(6, (24, 56))]
    text = split.apply_chat_template(image_message("Compare.", 2), add_generation_prompt=True)
    refs = [ImageRef(url=png_data_url(image)) for image in images]
    encoded = encode_image_row(tower, "tiny", text, refs, ImageLimits())
    assert not isinstance(encoded, str), encoded
    ids, inputs = encoded
    reference = processed(split, "Compare.", images)
    assert [tower.image_token_id if t < 0 else t for t in ids] == reference["input_ids"][0].tolist()
    assert [len(image.spans) for image in inputs] == [3, 3]
    assert all(image.pixel_values is None for image in inputs)  # loaded by the engine
    request = GenerationRequest(0, ids, SamplingParams(max_tokens=MAX_NEW), images=inputs)
    results, _ = generate_sync(loaded, [request], EngineConfig(page_size=8, num_pages=64))
    assert [list(results[0].token_ids)] == hf_vlm_greedy(model_dir, [reference], MAX_NEW)


def test_one_call_per_image_equals_transformers_call_over_the_rows_images(idefics3):
    """transformers encodes all the frames of a row's images in one call; the engine, one
    call per image (all its frames): the same bits, so two-image rows stay exact."""
    _, loaded, tower, split, _ = idefics3
    batch = processed(split, "Both?", [random_image(7, (40, 50)), random_image(8, (100, 30))])
    vlm = loaded.vision.vlm
    with torch.inference_mode():
        together = vlm.model.get_image_features(pixel_values=batch["pixel_values"])
    _, images = engine_prompt(tower, batch)
    ours = torch.cat([tower.encode(image) for image in images])
    assert torch.equal(ours, torch.cat(list(together.pooler_output)))


def test_a_cli_job_runs_split_images_exactly(idefics3, tmp_path):
    """OpenAI chat lines with images through `astrai-batch run`: Idefics3's rows give
    transformers' tokens, the repeated image encoded once; SmolVLM's image rows fail with
    the missing-package reason (its processor needs num2words), its text row runs."""
    model_dir, loaded, _, split, _ = idefics3
    photo, wide = random_image(31, (48, 40)), random_image(32, (100, 30))
    rows = [
        ("a", "What is shown?", photo),
        ("b", "Describe the picture.", wide),
        ("c", "What is shown? Briefly.", photo),
        ("t", "Just text.", None),
    ]
    got, summary = run_image_job(model_dir, rows, tmp_path, MAX_NEW)
    if loaded.vision.vlm.config.model_type == "smolvlm":
        assert {got[c]["finish_reason"] for c in "abc"} == {"error"}
        assert "(Qwen-VL's: torchvision; SmolVLM's: num2words, torchvision)" in got["a"]["error"]
        assert got["t"]["finish_reason"] in ("stop", "length")
        return
    inputs = [processed(split, q, [image] if image else []) for _, q, image in rows]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    for (custom_id, *_), want in zip(rows, expected, strict=True):
        assert got[custom_id]["completion_token_ids"] == want, custom_id
    assert summary["images_encoded"] == 2
