"""Rows with images on a vision model (the tiny LLaVA) outside the local executor: `plan`
counts their image tokens as `run` plans them (placeholders holding content ids, so two rows
share an image's pages only when the image is the same; checked against a brute-force page
count on the processor's own output), and `--executor ray` writes what a local run writes for
them (its read tasks encode the images with the model's processor, its workers load the
tower): the same completions, row errors and image counts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, run_cli, summary_of, write_jsonl
from vision_kit import png_data_url, processed, random_image, save_tiny_llava

PAGE = 16


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    return save_tiny_llava(tmp_path_factory.mktemp("llava"))


def chat(custom_id: str, question: str, image=None) -> dict:
    content = [{"type": "text", "text": question}]
    if image is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": png_data_url(image)}})
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}]},
    }


def test_plan_counts_image_tokens_and_keeps_different_images_apart(llava_dir, tmp_path):
    from transformers import AutoProcessor

    one, two = random_image(61), random_image(62)
    rows = [("a", "What?", one), ("b", "Why?", one), ("c", "What?", two), ("t", "Hello", None)]
    source = write_jsonl(tmp_path / "in.jsonl", [chat(*row) for row in rows])
    result = run_cli("plan", source, "--model", llava_dir, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    # brute force: the processor's ids, an image's placeholders keyed by which image it is
    processor = AutoProcessor.from_pretrained(llava_dir)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    pages, prompt_tokens, tails = set(), 0, 0
    for _, question, image in rows:
        ids = processed(processor, question, [image] if image else [])["input_ids"][0].tolist()
        keyed = [("image", id(image), i) if t == image_token else t for i, t in enumerate(ids)]
        prompt_tokens += len(keyed)
        full = len(keyed) // PAGE
        tails += len(keyed) - full * PAGE
        pages.update(tuple(keyed[: (k + 1) * PAGE]) for k in range(full))
    assert report["bad_rows"] == 0
    assert report["prompt_tokens"] == prompt_tokens
    assert report["unique_tokens"] == len(pages) * PAGE + tails
    # a and b share the first page (the image's placeholders), c's other image shares none
    assert report["reusable_tokens"] == prompt_tokens - report["unique_tokens"] > 0
    # the shared prefix shows the image's content ids (negative) and a readable preview
    (shared,) = report["top_shared_prefixes"]
    keyed = processed(processor, "What?", [one])["input_ids"][0].tolist()
    images = [t for t in shared["preview_token_ids"] if t < 0]
    assert len(images) == keyed[: len(shared["preview_token_ids"])].count(image_token) > 0
    assert f"<image: {len(images)} tokens>" in shared["preview"]


def test_ray_writes_what_a_local_run_writes_for_image_rows(llava_dir, tmp_path, ray_address):
    """Two images each asked twice (one large enough to wait as a byte range of the file),
    a broken image and a text row, on two workers: rows, errors and image counts as local."""
    one, two = random_image(71, (96, 96)), random_image(72)
    broken = {
        "custom_id": "broken",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "What?"},
        ]}]},
    }  # fmt: skip
    lines = [chat("a", "What?", one), chat("b", "Why?", one), chat("c", "What?", two)]
    lines += [chat("d", "Why?", two), broken, chat("text", "Hello")]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    local, sharded = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    first = run_cli("run", source, local, *engine_args(llava_dir))
    second = run_cli(
        "run", source, sharded, *engine_args(llava_dir),
        "--executor", "ray", "--workers", "2", "--worker-threads", "1",
    )  # fmt: skip
    assert first.exit_code == 0, first.stderr
    assert second.exit_code == 0, second.stderr
    columns = ["id", "completion", "finish_reason", "error", "prompt_tokens"]
    want = pq.read_table(local).select(columns).to_pylist()
    assert pq.read_table(sharded).select(columns).to_pylist() == want
    errors = {row["id"]: row["error"] for row in want if row["error"] is not None}
    assert list(errors) == ["broken"] and errors["broken"].startswith("image data URL")
    counts = ("failed_rows", "images_encoded")
    local_summary, ray_summary = summary_of(first.stdout), summary_of(second.stdout)
    assert [ray_summary[key] for key in counts] == [local_summary[key] for key in counts]
    assert local_summary["images_encoded"] >= 2
