"""`--task embed`: the job's embedding request, and the one per-row field it allows; whether
the model may honour an OpenAI line's ``body.dimensions`` (`Matryoshka`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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


@dataclass(frozen=True)
class Matryoshka:
    """Whether the model's embeddings keep their meaning when truncated (trained with a
    Matryoshka loss), as vLLM decides it from the model's config.json: a non-empty
    ``matryoshka_dimensions`` (the sizes it was trained at; only those are allowed) or
    ``is_matryoshka: true`` (any size)."""

    supported: bool = False
    dimensions: tuple[int, ...] | None = None

    def problem(self, dims: Any) -> str | None:
        """The row error of an OpenAI line's ``body.dimensions`` on this model, if any."""
        if dims is None:
            return None
        if not self.supported:
            return (
                f"body.dimensions {dims!r} cannot be honoured: the model is not a Matryoshka "
                "embedding model (its config.json has no matryoshka_dimensions or "
                "is_matryoshka), so a truncated vector would lose its meaning"
            )
        if self.dimensions is not None and dims not in self.dimensions:
            listed = ", ".join(map(str, self.dimensions))
            return (
                f"body.dimensions {dims!r} is not one of the model's Matryoshka dimensions "
                f"({listed})"
            )
        return None


def read_matryoshka(model_dir: Any) -> Matryoshka:
    """The model's `Matryoshka` facts from its config.json (a model directory, or a hub
    model's snapshot in the local cache; never downloads). No config: not Matryoshka."""
    path = _config_path(model_dir)
    if path is None:
        return Matryoshka()
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Matryoshka()
    if not isinstance(config, dict):
        return Matryoshka()
    sizes = config.get("matryoshka_dimensions")
    if isinstance(sizes, list) and sizes:
        return Matryoshka(True, tuple(int(size) for size in sizes))
    return Matryoshka(config.get("is_matryoshka") is True)


def _config_path(model_dir: Any) -> Path | None:
    if model_dir is None:
        return None
    root = Path(str(model_dir))
    if (root / "config.json").is_file():
        return root / "config.json"
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(model_dir), "config.json")
    except Exception:  # not a repo id, or no hub library: no config
        return None
    return Path(found) if isinstance(found, str) else None
