"""A tiny Gemma 3 (SigLIP tower, sliding and global decoder layers) runs token-exact against
transformers `generate` on the same processor output, its images' placeholders attending to
each other at prefill (`engine/vision/image_spans.py`), under the default (invariant)
numerics in the CPU flash kernel and in the block attention, and under fast numerics; a
row's logits are the same bits alone as in a crowd, with its prefill in chunks and with a
prefix-cache hit that ends inside its image."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_reference import bf16_near_tie
from invariance_kit import (
    assert_alone_equals_crowds,
    assert_same_rows,
    capture_rows,
    run_capturing,
    use_cuda_kernels_on_cpu,
)
from vision_kit import (
    GEMMA3_TOKENS_PER_IMAGE,
    engine_prompt,
    hf_vlm_greedy,
    hf_vlm_greedy_with_margins,
    processed,
    random_image,
    save_tiny_gemma3,
)

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner import invariant_plan
from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.image_spans import fit_chunk, image_runs

MAX_NEW = 8
WINDOW = 12  # the sliding layers' window: shorter than every prompt here


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    model_dir = save_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), window=WINDOW)
    return model_dir, load_model(model_dir)


@pytest.fixture(scope="module")
def greedy_rows(gemma3):
    """The rows' processor outputs and transformers' greedy tokens for them."""
    model_dir, loaded = gemma3
    inputs = rows(loaded.vision.processor)
    return inputs, hf_vlm_greedy(model_dir, inputs, MAX_NEW)


def engine_request(loaded, request_id, batch, params):
    ids, images = engine_prompt(loaded.vision, batch)
    return GenerationRequest(request_id, ids, params, images=images)


def rows(processor):
    cat, dog = random_image(1), random_image(2, (64, 32))
    return [
        processed(processor, "What is in this picture?", [cat]),
        processed(processor, "Describe it.", [dog]),
        processed(processor, "Compare the two.", [cat, dog]),
        processed(processor, "Compare.", [dog, cat]),
        processed(processor, "No image here, just text.", []),
    ]


def test_the_fixture_needs_the_bidirectional_image_mask(gemma3):
    """transformers' own logits change without `token_type_ids` (a causal mask over the
    images) on every image row: the tests below would see a causal engine."""
    from transformers import AutoModelForImageTextToText

    model_dir, loaded = gemma3
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    for batch in rows(loaded.vision.processor)[:4]:
        assert batch["input_ids"].shape[1] > WINDOW
        causal = {k: v for k, v in batch.items() if k != "token_type_ids"}
        with torch.inference_mode():
            want = model(**batch).logits[0, -1]
            got = model(**causal).logits[0, -1]
        assert not torch.equal(want, got)


def _flash_off(monkeypatch, loaded):
    """The block attention instead of the CPU flash kernel (as where its probe fails)."""
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda model, pool: None)
    return dataclasses.replace(loaded, probe_results={})


@pytest.mark.parametrize("path", ["flash", "block", "fast"])
def test_greedy_tokens_equal_transformers(gemma3, greedy_rows, monkeypatch, path):
    _, loaded = gemma3
    assert loaded.vision.tokens_per_image == GEMMA3_TOKENS_PER_IMAGE
    inputs, expected = greedy_rows
    if path == "block":
        loaded = _flash_off(monkeypatch, loaded)
    numerics = "fast" if path == "fast" else "invariant"
    params = SamplingParams(max_tokens=MAX_NEW)
    # 20 tokens a step: every prompt's prefill in chunks, none ending inside an image
    for budget in (20, 1024):
        config = EngineConfig(
            page_size=4, num_pages=192, max_num_batched_tokens=budget, numerics=numerics
        )
        requests = [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)]
        core = EngineCore(loaded, config)
        assert (core.runner.flash is not None) == (path == "flash")
        found = capture_rows(core, requests)
        for i, want in enumerate(expected):
            assert list(found[i][0]) == want, f"row {i}, budget {budget}"


@pytest.mark.parametrize("path", ["flash", "block", "bfloat16-kernel"])
def test_image_rows_are_batch_invariant(gemma3, monkeypatch, path):
    """Each watched row alone (no prefix cache, prefill in one step) and in a crowd of image
    and text rows under two token budgets, the prefix cache on: every generated position's
    logits torch.equal. In bfloat16 the CPU's C kernel runs attention, an image's tokens
    seeing the whole image through its `key_ends`."""
    model_dir, loaded = gemma3
    if path == "block":
        loaded = _flash_off(monkeypatch, loaded)
    if path == "bfloat16-kernel":
        loaded = load_model(model_dir, dtype="bfloat16")
        core = EngineCore(loaded, EngineConfig(page_size=4, num_pages=64))
        assert core.runner.invariant_kernel.__qualname__ == "CpuKernel.attend"
    processor = loaded.vision.processor
    images = [random_image(seed, (30 + 7 * seed, 40)) for seed in range(3)]
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True)
    questions = ["What is it?", "Name the colours in the picture.", "Count things."]
    inputs = []
    for i in range(9):
        shown = [images[i % 3], images[(i + 1) % 3]][: i % 3]  # none, one or two images
        inputs.append(processed(processor, questions[i % 3], shown))
    requests = [
        engine_request(loaded, i, b, sampled if i % 2 else greedy) for i, b in enumerate(inputs)
    ]
    watched = [1, 2, 6]  # one image (sampled), two images (greedy), a text row
    crowds = assert_alone_equals_crowds(
        loaded, requests, watched, (17, 512), page_size=4, pages=128
    )
    for stats in crowds:
        assert stats.images_encoded == 3  # once each per engine


def test_bfloat16_greedy_tokens_equal_transformers_in_the_cpu_kernel(gemma3, greedy_rows):
    """bfloat16 on the CPU (the C kernel, an image's tokens seeing the whole image) against
    transformers in bfloat16: token for token up to a near-tie of transformers' own top two
    logits (`bf16_near_tie`)."""
    model_dir, _ = gemma3
    inputs, _ = greedy_rows
    loaded = load_model(model_dir, dtype="bfloat16")
    expected = hf_vlm_greedy_with_margins(model_dir, inputs, MAX_NEW, torch.bfloat16)
    params = SamplingParams(max_tokens=MAX_NEW)
    config = EngineConfig(page_size=4, num_pages=192, max_num_batched_tokens=20)
    core = EngineCore(loaded, config)
    assert core.runner.invariant_kernel.__qualname__ == "CpuKernel.attend"
    found = capture_rows(core, [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)])
    exact = 0
    for i, (want, top2) in enumerate(expected):
        got = list(found[i][0])
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        exact += first is None
        if first is not None:
            assert bf16_near_tie(*top2[first]), (i, first, top2[first])
    assert exact >= len(inputs) - 1


def test_a_prefix_cache_hit_inside_an_image_is_exact(gemma3):
    """Two rows with the same image and different questions: the second's hit ends on a
    16-token page boundary inside the image's placeholders (the pages before it were
    computed seeing the whole image), and the chunk after it computes the rest of the image
    with every key in the pool: tokens equal transformers, logits equal the row alone."""
    model_dir, loaded = gemma3
    processor = loaded.vision.processor
    cat = random_image(1)
    inputs = [
        processed(processor, "What is in this picture?", [cat]),
        processed(processor, "Name the colours.", [cat]),
    ]
    expected = hf_vlm_greedy(model_dir, inputs, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW)
    requests = [engine_request(loaded, i, b, params) for i, b in enumerate(inputs)]
    image = requests[1].images[0]
    config = EngineConfig(page_size=16, num_pages=32)
    core = EngineCore(loaded, config)
    logits: dict = {}
    core.logits_observer = lambda rid, _i, row: logits.setdefault(rid, []).append(row.clone())
    results = {}
    for request in requests:  # the second waits for the first's pages, then hits them
        assert core.add_request(request) == []
    while core.num_unfinished:
        results.update((r.request_id, r) for r in core.step())
    assert [list(results[i].token_ids) for i in (0, 1)] == expected
    hit = results[1].cached_tokens
    assert image.offset < hit < image.end  # the hit ends inside the image
    stats = core.stats()
    assert stats.image_tokens_cached == hit - image.offset
    assert stats.images_encoded == 1 and stats.image_encodes_saved == 1
    alone, _ = run_capturing(
        loaded, [requests[1]], EngineConfig(page_size=16, num_pages=32, enable_prefix_cache=False)
    )
    assert_same_rows(alone, {1: (results[1].token_ids, logits[1])}, [1])


def test_an_image_longer_than_the_step_budget_is_a_row_error(gemma3):
    _, loaded = gemma3
    batch = processed(loaded.vision.processor, "What is it?", [random_image(3)])
    request = engine_request(loaded, "r", batch, SamplingParams(max_tokens=2))
    config = EngineConfig(page_size=4, num_pages=64, max_num_batched_tokens=12)
    [result] = EngineCore(loaded, config).add_request(request)
    assert result.error == (
        "an image takes 16 placeholder tokens, computed in one step with this model, more "
        "than the step's token budget (12, --max-num-batched-tokens)"
    )


def test_the_cuda_invariant_kernel_is_refused(gemma3, monkeypatch):
    _, loaded = gemma3
    use_cuda_kernels_on_cpu(monkeypatch)
    with pytest.raises(ValueError) as raised:
        EngineCore(
            dataclasses.replace(loaded, probe_results={}),
            EngineConfig(page_size=4),
            invariance_probe=False,
        )
    assert str(raised.value) == (
        "the CUDA invariant attention kernel cannot let an image's tokens attend to each "
        "other (Gemma 3): run this model on the CPU or with fast numerics"
    )


def _image(offset: int, length: int) -> ImageInput:
    return ImageInput(bytes(32), offset, length, torch.zeros(1))


def test_a_chunk_never_ends_inside_an_image_run():
    images = (_image(4, 8), _image(12, 8), _image(30, 8))  # the first two are one run
    assert image_runs(images) == [(4, 20), (30, 38)]
    assert fit_chunk(images, 0, 10) == 4  # cut at the run's start
    assert fit_chunk(images, 4, 10) == 0  # inside: waits for room for the whole run
    assert fit_chunk(images, 4, 16) == 16
    assert fit_chunk(images, 10, 10) == 10  # starts inside (a cache hit), ends at its end
    assert fit_chunk(images, 20, 15) == 10
    assert fit_chunk(images, 20, 18) == 18
    assert fit_chunk((), 0, 7) == 7
