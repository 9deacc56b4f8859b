"""Resume that survives operations: budgets, threads and planning settings may change between
runs, the input and the model are known by their content, not their paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from jobs.jobkit import (
    comparable,
    job_args,
    killed_part_way,
    listing,
    run_cli,
    saved_rows,
    summary_of,
)

RERUN_SETTINGS = {
    # The usual fix after running out of memory, and fewer threads.
    "budgets": (
        "--kv-cache-memory",
        "16MiB",
        "--max-num-seqs",
        "3",
        "--max-num-batched-tokens",
        "64",
        "--threads",
        "1",
        "--no-prefix-cache",
    ),
    # Planning settings: the resumed job keeps the checkpoint's, so prefix groups agree.
    "planning": ("--page-size", "8", "--group-window", "25", "--no-grouping"),
}


@pytest.mark.parametrize("settings", sorted(RERUN_SETTINGS))
def test_a_rerun_with_other_budgets_or_planning_resumes_and_equals_an_uninterrupted_run(
    tiny_llama_dir: Path, job: dict[str, Path], settings: str
) -> None:
    args, done_before = killed_part_way(tiny_llama_dir, job)

    result = run_cli(*args, *RERUN_SETTINGS[settings])

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == done_before > 0
    assert comparable(job["output"]) == comparable(job["reference"])


def test_the_same_input_and_model_at_new_paths_resume(
    tiny_llama_dir: Path, job: dict[str, Path], tmp_path: Path
) -> None:
    _, done_before = killed_part_way(tiny_llama_dir, job)
    # A retry that downloads the same input again, and the model moved elsewhere.
    moved = tmp_path / "downloads"
    moved.mkdir()
    source = Path(shutil.copy(job["source"], moved / "again.jsonl"))
    model = Path(shutil.copytree(tiny_llama_dir, moved / "model"))

    result = run_cli(*job_args(model, source, job["output"]))

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["resumed_rows"] == done_before > 0
    assert comparable(job["output"]) == comparable(job["reference"])
    assert listing(job["output"].parent) == ["downloads", "out.parquet", "out.stats.parquet"]


def test_one_changed_byte_of_the_input_is_refused_naming_the_input(
    tiny_llama_dir: Path, job: dict[str, Path], tmp_path: Path
) -> None:
    _, done_before = killed_part_way(tiny_llama_dir, job)
    data = job["source"].read_bytes()
    at = data.index(b"Question 60")
    changed = tmp_path / "changed.jsonl"
    changed.write_bytes(data[:at] + b"q" + data[at + 1 :])

    result = run_cli(*job_args(tiny_llama_dir, changed, job["output"]))

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the checkpoint in {job['checkpoint']} was made by a different job (input file "
        f"{changed.resolve()} differs from {job['source'].resolve()}, the checkpoint's input); "
        "rerun with --restart to discard it and start over, or restore the original settings "
        "to resume\n"
    )
    assert saved_rows(job["checkpoint"]) == done_before
    assert not job["output"].exists()
