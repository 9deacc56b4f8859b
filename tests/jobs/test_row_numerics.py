"""A row's sampled completion depends on the row, not on the job around it.

The same rows run as one job, as two jobs of halves, and with another token budget: every
seeded-sampled completion is identical (seeds follow the row id, numerics are batch
invariant). A checkpoint made with one numerics mode refuses to be resumed with the other.
"""

from __future__ import annotations

import signal
from pathlib import Path

from jobs.jobkit import (
    engine_args,
    read_rows,
    run_cli,
    shared_prefix_prompts,
    stop_after_parts,
    write_jsonl,
)

ROWS = 48


def sampled_job(model_dir: Path, source: Path, output: Path, *extra: str) -> list:
    return [
        "run",
        source,
        output,
        *engine_args(model_dir),
        "--max-tokens",
        "10",
        "--temperature",
        "0.8",
        "--seed",
        "3",
        *extra,
    ]


def completions(path: Path) -> dict[str, str]:
    return {row["id"]: row["completion"] for row in read_rows(path)}


def test_one_job_equals_two_halves_and_another_budget(tiny_llama_dir: Path, tmp_path: Path):
    lines = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(ROWS))]
    whole = write_jsonl(tmp_path / "whole.jsonl", lines)
    # the halves interleave, so every row has another position and other neighbours
    first = write_jsonl(tmp_path / "first.jsonl", lines[1::2])
    second = write_jsonl(tmp_path / "second.jsonl", lines[::2][::-1])
    outputs = {}
    for name, source, extra in [
        ("whole", whole, ()),
        ("first", first, ()),
        ("second", second, ()),
        ("budget", whole, ("--max-num-batched-tokens", "24", "--max-num-seqs", "5")),
    ]:
        outputs[name] = tmp_path / f"{name}.parquet"
        result = run_cli(*sampled_job(tiny_llama_dir, source, outputs[name], *extra))
        assert result.exit_code == 0, result.stderr
    reference = completions(outputs["whole"])
    assert len(reference) == ROWS and len(set(reference.values())) > ROWS // 2
    halves = {**completions(outputs["first"]), **completions(outputs["second"])}
    assert halves == reference
    assert completions(outputs["budget"]) == reference


def test_a_checkpoint_refuses_the_other_numerics(tiny_llama_dir: Path, tmp_path: Path):
    lines = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(120))]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    checkpoint = tmp_path / ".out.parquet.ckpt"
    args = sampled_job(tiny_llama_dir, source, output, "--checkpoint-rows", "4")
    returncode, _, _ = stop_after_parts(args, checkpoint, 2, signal.SIGKILL)
    assert returncode == -signal.SIGKILL

    result = run_cli(*args, "--fast-numerics")

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the checkpoint in {checkpoint} was made by a different job "
        "(fast_numerics False -> True); rerun with --restart to discard it and start over, or "
        "restore the original settings to resume\n"
    )
