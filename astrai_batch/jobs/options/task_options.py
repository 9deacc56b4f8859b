"""The `--task` option: what a job computes per row, and what each task allows."""

from __future__ import annotations

from astrai_batch.engine import SamplingParams
from astrai_batch.engine.tasks.embedding_types import POOLINGS
from astrai_batch.errors import ConfigError
from astrai_batch.io.task_fields import TASKS
from astrai_batch.jobs.options.option_groups import SAMPLING_OPTIONS

__all__ = [
    "TASKS",
    "check_embed_options",
    "check_task",
    "check_task_sampling",
    "task_prompt_column",
]


def check_task(task: object, output_format: str | None) -> None:
    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "score" and output_format == "openai-jsonl":
        raise ConfigError("--task score writes Parquet (parquet or parquet-dir), not openai-jsonl")


def check_task_sampling(task: str, sampling: SamplingParams, default: SamplingParams) -> None:
    """Score and embed generate nothing: a sampling option or constraint set for them is
    refused (it would be ignored, and `--n 2` would wait for a second result forever)."""
    if task == "generate":
        return
    given, usual = sampling.to_dict(), default.to_dict()
    for name in SAMPLING_OPTIONS:
        if given.get(name) != usual.get(name):
            flag = name.replace("_", "-")
            raise ConfigError(f"--{flag} is an option of --task generate, not of --task {task}")
    if sampling.constraint is not None:
        raise ConfigError(
            f"a constraint (--{sampling.constraint.kind.replace('_', '-')}) is an option of "
            f"--task generate, not of --task {task}"
        )


def task_prompt_column(task: str, prompt_column: str | None) -> str | None:
    """A score row's context is read from ``context`` unless --prompt-column names another."""
    if task == "score" and prompt_column is None:
        return "context"
    return prompt_column


def check_embed_options(pooling: object, normalize: object, dimensions: object) -> None:
    if pooling is not None and pooling not in POOLINGS:
        raise ConfigError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if not isinstance(normalize, bool):
        raise ConfigError(f"normalize must be a boolean, got {normalize!r}")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise ConfigError(f"dimensions must be a positive integer, got {dimensions!r}")
