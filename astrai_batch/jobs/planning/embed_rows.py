"""`--task embed`: the job's embedding request, and the one per-row field it allows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astrai_batch.engine.tasks.embedding_types import EmbedRequest

# sentence-transformers' Pooling config keys, in the order a mode is picked
ST_POOLING_KEYS = (
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
)


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


def sentence_transformers_pooling(model_dir: str | Path | None) -> str | None:
    """The pooling a sentence-transformers model declares (``modules.json`` names its
    Pooling module's folder), or None where the model has no such config."""
    if model_dir is None:
        return None
    root = Path(model_dir)
    modules = root / "modules.json"
    if not modules.is_file():
        modules = _hub_cached(str(model_dir))
        if modules is None:
            return None
        root = modules.parent
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
        for entry in entries:
            if str(entry.get("type", "")).endswith("Pooling"):
                config = json.loads(
                    (root / entry.get("path", "") / "config.json").read_text(encoding="utf-8")
                )
                for key, pooling in ST_POOLING_KEYS:
                    if config.get(key):
                        return pooling
    except (OSError, ValueError, AttributeError):
        return None
    return None


def job_embed_request(
    pooling: str | None, normalize: bool, dimensions: int | None, model_dir: Any
) -> EmbedRequest:
    """The job's embedding request: --pooling, else the model's sentence-transformers
    config, else last-token pooling."""
    chosen = pooling or sentence_transformers_pooling(model_dir) or "last"
    return EmbedRequest(pooling=chosen, normalize=normalize, dimensions=dimensions)


def _hub_cached(repo_id: str) -> Path | None:
    """A hub model's ``modules.json`` where it is in the local cache (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "modules.json")
    except Exception:  # not a repo id, or no hub library: no config
        return None
    return Path(found) if isinstance(found, str) else None
