"""The `--task` option: what score and embed jobs refuse, with exact one-line messages."""

from __future__ import annotations

import pytest
from jobs.jobkit import run_cli, write_jsonl

from astrai_batch.engine import GenerationRequest, SamplingParams
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import JobConfig


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "summarize"}, "task must be one of generate, score, embed, got 'summarize'"),
        (
            {"task": "score", "output_format": "openai-jsonl"},
            "--task score writes Parquet (parquet or parquet-dir), not openai-jsonl",
        ),
        ({"task": "embed", "n": 2}, "--n is an option of --task generate, not of --task embed"),
        (
            {"task": "score", "max_tokens": 3},
            "--max-tokens is an option of --task generate, not of --task score",
        ),
        (
            {"task": "score", "temperature": 0.7},
            "--temperature is an option of --task generate, not of --task score",
        ),
        (
            {"task": "embed", "top_logprobs": 2},
            "--top-logprobs is an option of --task generate, not of --task embed",
        ),
        (
            {"task": "score", "regex": "[a-z]+"},
            "a constraint (--regex) is an option of --task generate, not of --task score",
        ),
    ],
)
def test_options_a_task_cannot_use_are_refused(options, message) -> None:
    with pytest.raises(ConfigError) as raised:
        JobConfig.from_options(options)
    assert str(raised.value) == message


def test_the_defaults_are_accepted_for_every_task() -> None:
    for task in ("generate", "score", "embed"):
        assert JobConfig.from_options({"task": task, "max_tokens": 256}).task == task


def test_an_embed_job_with_n_2_is_a_usage_error_not_a_hang(tmp_path) -> None:
    # It waited forever for a second embedding of each row.
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hello"}])

    result = run_cli("run", source, tmp_path / "out.parquet", "--task", "embed", "--n", "2")

    assert result.exit_code == 2
    assert result.stderr.endswith(
        "\nError: --n is an option of --task generate, not of --task embed\n"
    )
    assert list(tmp_path.iterdir()) == [source]


def test_the_engine_refuses_an_embedding_request_of_n_2() -> None:
    with pytest.raises(ValueError, match=r"^a scoring or embedding request takes n=1, got n=2$"):
        GenerationRequest(0, [1, 2], SamplingParams(n=2), embed=EmbedRequest())


@pytest.mark.parametrize("task", ["score", "embed"])
def test_score_and_embed_run_on_ray(task) -> None:
    config = JobConfig.from_options({"task": task, "executor": "ray", "workers": 2})
    assert (config.task, config.executor) == (task, "ray")
