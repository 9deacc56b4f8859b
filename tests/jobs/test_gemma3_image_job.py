"""A Gemma 3 image job end to end through the CLI: OpenAI chat lines with one image, two
images and none; each row's tokens equal transformers `generate` on the processor's own
output of the chat (its template's `<start_of_image>` expanded into the image's tokens)."""

from __future__ import annotations

import pyarrow.parquet as pq
from jobs.jobkit import run_cli, write_jsonl
from vision_kit import hf_vlm_greedy, png_data_url, random_image, save_tiny_gemma3

MAX_TOKENS = 6


def chat_line(custom_id: str, question: str, images: list) -> dict:
    content = [{"type": "image_url", "image_url": {"url": png_data_url(i)}} for i in images]
    content.append({"type": "text", "text": question})
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}]},
    }


def test_gemma3_image_lines_run_exactly(tmp_path):
    from transformers import AutoProcessor

    model_dir = save_tiny_gemma3(tmp_path / "gemma3")
    cat, dog = random_image(31), random_image(32, (48, 36))
    rows = [
        ("one", "What is shown?", [cat]),
        ("two", "Which is brighter?", [cat, dog]),
        ("text", "Just text, no picture.", []),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [chat_line(*row) for row in rows])
    output = tmp_path / "out.parquet"
    result = run_cli(
        "run", source, output, "--model", model_dir, "--max-tokens", MAX_TOKENS,
        "--kv-cache-memory", "8MiB", "--max-num-batched-tokens", 24, "--save-tokens", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    got = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    processor = AutoProcessor.from_pretrained(model_dir)
    inputs = []
    for _, question, images in rows:
        content = [{"type": "image", "image": image} for image in images]
        content.append({"type": "text", "text": question})
        inputs.append(
            processor.apply_chat_template(
                [{"role": "user", "content": content}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
            )
        )
    expected = hf_vlm_greedy(model_dir, inputs, MAX_TOKENS)
    for (custom_id, *_), want, batch in zip(rows, expected, inputs, strict=True):
        row = got[custom_id]
        assert row["finish_reason"] in ("stop", "length"), row["error"]
        assert row["completion_token_ids"] == want, custom_id
        assert row["prompt_tokens"] == batch["input_ids"].shape[1]
