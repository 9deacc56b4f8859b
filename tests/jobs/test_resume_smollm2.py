"""Resume on the real SmolLM2 with sampling: kill -9 three times, then finish the job; every
column but `cached_tokens` equals an uninterrupted run (slow: real weights).

Before batch-invariant numerics, a resumed row could differ in its last bits from the
uninterrupted run (its steps held other rows), and a sample near a boundary flipped.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from jobs.jobkit import (
    SYSTEM_PROMPTS,
    comparable,
    question,
    run_cli,
    saved_rows,
    stop_after_parts,
    summary_of,
    write_jsonl,
)

# long: the promise is soaked on the tiny model by scripts/soak; this is the real model's
pytestmark = [pytest.mark.slow, pytest.mark.long]

ROWS = 24


def chat_rows() -> list[dict]:
    """Multi-turn chats that share system prompts, with turns of a few hundred characters."""
    rows = []
    for i in range(ROWS):
        history = " ".join(question(i + k) for k in range(i % 4 + 1))
        messages = [
            {"role": "system", "content": SYSTEM_PROMPTS[i % 3]},
            {"role": "user", "content": history},
            {"role": "assistant", "content": f"Let me think about {history[: 40 + i]}."},
            {"role": "user", "content": question(i) + " Explain your answer step by step."},
        ]
        rows.append({"id": f"chat-{i}", "messages": messages})
    return rows


def job_args(source: Path, output: Path) -> list:
    return [
        "run",
        source,
        output,
        "--model",
        "smollm2-135m",
        "--max-tokens",
        "16",
        "--temperature",
        "0.8",
        "--seed",
        "7",
        "--ignore-eos",
        "--checkpoint-rows",
        "4",
        "--group-window",
        "12",
        "--kv-cache-memory",
        "64MiB",
        "--quiet",
    ]


def test_smollm2_sampled_resume_after_three_kills_equals_uninterrupted(tmp_path: Path):
    source = write_jsonl(tmp_path / "chats.jsonl", chat_rows())
    reference = tmp_path / "reference.parquet"
    assert run_cli(*job_args(source, reference)).exit_code == 0
    output = tmp_path / "out.parquet"
    checkpoint = tmp_path / ".out.parquet.ckpt"
    args = job_args(source, output)
    for parts in (1, 3, 5):
        returncode, _, _ = stop_after_parts(args, checkpoint, parts, signal.SIGKILL, timeout=1200)
        assert returncode == -signal.SIGKILL
    done_before = saved_rows(checkpoint)
    assert 0 < done_before < ROWS

    result = run_cli(*args)

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == done_before
    assert comparable(output) == comparable(reference)
