"""Rows with images through a whole job (one run, to stay cheap) on a text-only model: OpenAI
lines with image_url parts and --image-column cells fail in their own rows with the reason,
text rows beside them run, and the exit status is that of row errors."""

from __future__ import annotations

from pathlib import Path

from jobs.jobkit import engine_args, read_rows, run_cli, summary_of, write_jsonl


def chat(custom_id: str, content) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}]},
    }


def test_image_rows_fail_alone_on_a_text_model(tiny_llama_dir: Path, tmp_path: Path) -> None:
    lines = [
        chat("text", "Hello"),
        chat("image", [{"type": "image_url", "image_url": {"url": "cat.png"}},
                       {"type": "text", "text": "What is it?"}]),
        chat("bad", [{"type": "image_url", "image_url": {"detail": "low"}}]),
        {"id": "column", "prompt": "Describe", "img": "cat.png"},
        {"id": "no-image", "prompt": "Describe", "img": None},
    ]  # fmt: skip
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    args = (*engine_args(tiny_llama_dir), "--image-column", "img")
    result = run_cli("run", source, output, *args)
    summary = summary_of(result.stdout)
    assert (result.exit_code, summary["failed_rows"]) == (0, 3), result.stderr
    rows = read_rows(output)
    reason = (
        f"the row has images, but model '{tiny_llama_dir}' reads text only (use a vision model)"
    )
    assert [row["error"] for row in rows] == [
        None,
        reason,
        "body.messages[0] content[0] image_url has no url",
        reason,
        None,  # no image: a plain user message on the chat template
    ]
    assert [row["finish_reason"] for row in rows][1:4] == ["error"] * 3
