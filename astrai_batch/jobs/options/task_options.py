"""The `--task` option: what a job computes per row, and what each task allows."""

from __future__ import annotations

from astrai_batch.errors import ConfigError
from astrai_batch.io.task_fields import TASKS

__all__ = ["TASKS", "check_task", "task_prompt_column"]


def check_task(task: object, output_format: str, executor: str) -> None:
    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "score" and output_format == "openai-jsonl":
        raise ConfigError("--task score writes Parquet (parquet or parquet-dir), not openai-jsonl")
    if task == "score" and executor != "local":
        raise ConfigError("--task score runs with --executor local only")


def task_prompt_column(task: str, prompt_column: str | None) -> str | None:
    """A score row's context is read from ``context`` unless --prompt-column names another."""
    if task == "score" and prompt_column is None:
        return "context"
    return prompt_column
