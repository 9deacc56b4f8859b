"""Image jobs end to end through the CLI on a tiny LLaVA: OpenAI chat lines whose images are
data URLs, a local path and a broken image, beside a text-only line. Each good row's tokens
equal transformers `generate` on the processor's own output; the broken image is its row's
one-line error and the job goes on; the stats count one vision-tower run per distinct image."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import run_cli, write_jsonl
from vision_kit import TOKENS_PER_IMAGE, hf_vlm_greedy, png_data_url, random_image, save_tiny_llava

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    return save_tiny_llava(tmp_path_factory.mktemp("llava"))


def chat_line(custom_id: str, question: str, url: str | None) -> dict:
    content = [{"type": "text", "text": question}]
    if url is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": url, "detail": "low"}})
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}]},
    }


def reference(processor, question: str, image) -> dict:
    content = [{"type": "text", "text": question}]
    if image is not None:
        content.insert(0, {"type": "image", "image": image})
    return processor.apply_chat_template(
        [{"role": "user", "content": content}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )


def test_openai_image_lines_run_exactly_and_a_broken_image_fails_its_row(llava_dir, tmp_path):
    from transformers import AutoProcessor

    photo, other = random_image(21), random_image(22, (48, 36))
    local = tmp_path / "other.png"
    other.save(local)
    broken = "data:image/png;base64," + base64.b64encode(b"\x89PNG but not really").decode()
    rows = [
        ("same-1", "What is shown?", png_data_url(photo), photo),
        ("local", "Describe the picture.", str(local), other),
        ("broken", "What is shown?", broken, None),
        ("same-2", "What is shown? Answer briefly.", png_data_url(photo), photo),
        ("text", "Just text, no picture.", None, None),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [chat_line(c, q, u) for c, q, u, _ in rows])
    output = tmp_path / "out.parquet"
    result = run_cli(
        "run", source, output, "--model", llava_dir, "--max-tokens", MAX_TOKENS,
        "--kv-cache-memory", "8MiB", "--save-tokens", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr  # row errors do not fail the job by default
    got = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    failed = got["broken"]
    assert failed["finish_reason"] == "error"
    assert failed["error"] == (
        "image data URL (image/png, 50 characters) is not an image Pillow can decode (unknown "
        "or corrupt header)"
    )
    processor = AutoProcessor.from_pretrained(llava_dir)
    good = [row for row in rows if row[0] != "broken"]
    inputs = [reference(processor, question, image) for _, question, _, image in good]
    expected = hf_vlm_greedy(llava_dir, inputs, MAX_TOKENS)
    for (custom_id, *_), want, batch in zip(good, expected, inputs, strict=True):
        row = got[custom_id]
        assert row["finish_reason"] in ("stop", "length"), row["error"]
        assert row["completion_token_ids"] == want, custom_id
        assert row["prompt_tokens"] == batch["input_ids"].shape[1]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["failed_rows"] == 1
    # two distinct images: each through the vision tower once; the second photo row's image
    # came from the prefix cache (its pages) or the encoder cache (its features)
    assert summary["images_encoded"] == 2
    assert (
        summary["image_encodes_saved"] * TOKENS_PER_IMAGE + summary["image_tokens_cached"]
        >= TOKENS_PER_IMAGE
    )
    stats = pq.read_table(tmp_path / "out.stats.parquet").to_pylist()
    assert stats[-1]["is_total"] and stats[-1]["images_encoded"] == 2
