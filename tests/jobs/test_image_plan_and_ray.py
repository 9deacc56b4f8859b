"""Rows with images on a vision model (the tiny LLaVA) outside the local executor: `plan`
counts their image tokens as `run` plans them (placeholders holding content ids, so two rows
share an image's pages only when the image is the same; checked against a brute-force page
count on the processor's own output), and `--executor ray`, whose workers do not load the
vision tower, fails those rows with a line naming that limitation while text rows run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobs.jobkit import engine_args, read_rows, run_cli, write_jsonl
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


def test_ray_fails_image_rows_with_the_limitation_and_runs_text_rows(
    llava_dir, tmp_path, ray_address
):
    lines = [chat("image", "What?", random_image(71)), chat("text", "Hello")]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    result = run_cli(
        "run", source, output, *engine_args(llava_dir),
        "--executor", "ray", "--workers", "1", "--worker-threads", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = {row["id"]: row for row in read_rows(output)}
    assert rows["image"]["error"] == (
        "rows with images do not run under --executor ray yet (its workers do not load the "
        f"vision tower of '{llava_dir}'); run them with --executor local"
    )
    assert rows["text"]["error"] is None and rows["text"]["finish_reason"] in ("stop", "length")
