"""A job's identity for resuming: the input, the model and the options that shape results.

A checkpoint is resumed only by a job with an equal identity; otherwise the differences are
named, one short phrase each, in the refusal message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from astrai_batch.jobs.config import JobConfig


def job_identity(
    config: JobConfig, input_fingerprint: Mapping[str, Any], model_name: str, model_source: str
) -> dict[str, Any]:
    return {
        "input": dict(input_fingerprint),
        "model": {"name": model_name, "source": model_source},
        "options": config.result_options(),
    }


def job_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two job identities, e.g. ``max_tokens 8 -> 16``. Both are compared
    as JSON stores them (tuples become lists)."""
    saved, current = json.loads(json.dumps(saved)), json.loads(json.dumps(current))
    out = _input_differences(saved.get("input") or {}, current.get("input") or {})
    saved_model, model = saved.get("model") or {}, current.get("model") or {}
    if saved_model != model:
        out.append(
            f"model {saved_model.get('name')!r} ({saved_model.get('source')}) -> "
            f"{model.get('name')!r} ({model.get('source')})"
        )
    saved_options, options = saved.get("options") or {}, current.get("options") or {}
    for name in sorted(set(saved_options) | set(options)):
        before, after = saved_options.get(name), options.get(name)
        if before != after:
            out.append(f"{name} {_show(before)} -> {_show(after)}")
    return out


def _input_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    if saved == current:
        return []
    saved_files = [item.get("path") for item in saved.get("files", [])]
    files = [item.get("path") for item in current.get("files", [])]
    if saved.get("format") != current.get("format") or saved_files != files:
        return [f"input {', '.join(map(str, saved_files))} -> {', '.join(map(str, files))}"]
    changed = [
        str(mine.get("path"))
        for mine, theirs in zip(saved.get("files", []), current.get("files", []), strict=True)
        if mine != theirs
    ]
    return [f"input file {path} was modified" for path in changed]


def _show(value: Any) -> str:
    return "unset" if value is None else repr(value)
