"""`--task embed`: the job's embedding request, and the one per-row field it allows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.engine.tasks.embedding_types import DenseStep, EmbedRequest
from astrai_batch.engine.tasks.sentence_modules import read_sentence_modules
from astrai_batch.errors import ConfigError


def embed_row_problem(overrides: Mapping[str, Any], embed: EmbedRequest) -> str | None:
    """An OpenAI line's ``body.dimensions`` must be the job's: the output has one size."""
    dims = overrides.get("dimensions")
    if dims is not None and dims != embed.dimensions:
        job = "none" if embed.dimensions is None else str(embed.dimensions)
        return (
            f"body.dimensions {dims!r} differs from the job's --dimensions ({job}); "
            f"run the job with --dimensions {dims}"
        )
    return None


def job_embed_request(
    pooling: str | None,
    normalize: bool,
    dimensions: int | None,
    model_dir: Any,
    hidden_size: int | None = None,
) -> EmbedRequest:
    """The job's embedding request: the model's sentence-transformers modules
    (`engine.tasks.sentence_modules`: its pooling, Dense and Normalize modules, its
    max_seq_length), with --pooling in place of the model's pooling where given; last-token
    pooling for a model without them. Refused (ConfigError) at start: a module we cannot run,
    a model whose modules declare no pooling and no --pooling, a Dense layer whose input is
    not the model's hidden size, --dimensions above the vector's size."""
    modules = read_sentence_modules(model_dir)
    if modules is None:
        request = EmbedRequest(pooling or "last", normalize, dimensions)
    else:
        chosen = pooling or modules.pooling
        if chosen is None:
            raise ConfigError(
                "the model's sentence-transformers modules.json declares no Pooling module; "
                "choose one with --pooling"
            )
        request = EmbedRequest(chosen, normalize, dimensions, modules.head, modules.max_seq_length)
    if hidden_size is not None:
        width = hidden_size
        for step in request.head:
            if isinstance(step, DenseStep):
                if step.in_features != width:
                    raise ConfigError(
                        f"the model's sentence-transformers Dense {step.source} takes "
                        f"{step.in_features} values, the pooled vector has {width}"
                    )
                width = step.out_features
        if dimensions is not None and dimensions > width:
            raise ConfigError(
                f"--dimensions {dimensions} exceeds the model's embedding size of {width}"
            )
    return request
