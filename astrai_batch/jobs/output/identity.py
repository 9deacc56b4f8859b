"""A job's identity for resuming: what defines its results, and nothing else.

The identity holds the input's content (`io.fingerprint`: not its path or mtime), the
model's files (a digest of the directory it was loaded from; for a hub model, the cached
snapshot of its revision; not its name or path) and the result options
(`option_groups.RESULT_OPTIONS`). A checkpoint is resumed only by a job with an equal identity;
otherwise every difference is named, one short phrase in the user's terms each, in the
refusal message. Paths and names are stored beside the digests only to write those phrases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from astrai_batch.io.fingerprint import directory_fingerprint, same_content

if TYPE_CHECKING:  # loading torch is not needed to compare identities
    from astrai_batch.engine.model.loaded import LoadedModel
    from astrai_batch.jobs.options.config import JobConfig


def job_identity(
    config: JobConfig,
    input_fingerprint: Mapping[str, Any],
    loaded: LoadedModel,
    adapters: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`adapters`: {LoRA adapter name: digest of its files}, present only when the job has
    adapters (a job without keeps the identity it always had)."""
    identity = {
        "input": dict(input_fingerprint),
        "model": model_identity(loaded, config.revision),
        "options": config.result_options(),
    }
    if adapters:
        identity["adapters"] = dict(adapters)
    return identity


def model_identity(loaded: LoadedModel, revision: str | None) -> dict[str, Any]:
    """{name, source, digest}: `digest` names the files the model was loaded from (for a hub
    model, its cached snapshot of `revision`; by name and revision if none is found)."""
    return model_identity_of(loaded.name, loaded.source, revision)


def model_identity_of(name: str, source: str, revision: str | None) -> dict[str, Any]:
    """`model_identity` from the model's name and where its files are, without loading it
    (a Ray driver loads only the tokenizer)."""
    from pathlib import Path

    from astrai_batch.engine.model.loader import model_files_dir
    from astrai_batch.io.fingerprint import file_fingerprint

    if Path(source).is_file():  # a GGUF file not converted yet
        digest = f"file:{json.dumps(file_fingerprint(Path(source)), sort_keys=True)}"
        return {"name": name, "source": source, "digest": digest}
    files = model_files_dir(_Named(name, source), revision)  # type: ignore[arg-type]
    if files is not None:
        digest = f"files:{directory_fingerprint(files)}"
    else:
        digest = f"hub:{source}@{revision or 'main'}"
    return {"name": name, "source": source, "digest": digest}


@dataclass(frozen=True)
class _Named:
    """What `model_files_dir` reads of a loaded model: its source."""

    name: str
    source: str


def job_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two job identities, e.g. ``max_tokens 8 -> 16``. Both are compared
    as JSON stores them (tuples become lists)."""
    saved, current = json.loads(json.dumps(saved)), json.loads(json.dumps(current))
    out = _input_differences(saved.get("input") or {}, current.get("input") or {})
    out += _model_differences(saved.get("model") or {}, current.get("model") or {})
    out += adapter_differences(saved.get("adapters") or {}, current.get("adapters") or {})
    saved_options, options = saved.get("options") or {}, current.get("options") or {}
    for name in sorted(set(saved_options) | set(options)):
        before, after = saved_options.get(name), options.get(name)
        if before != after:
            out.append(f"{name} {_show(before)} -> {_show(after)}")
    return out


def _model_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    if saved.get("digest") == current.get("digest"):
        return []  # the same files, wherever they are now
    before = f"{saved.get('name')!r} ({saved.get('source')})"
    after = f"{current.get('name')!r} ({current.get('source')})"
    if before == after:
        return [f"model {after} has different files"]
    return [f"model {before} -> {after}"]


def _input_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    saved_files, files = saved.get("files", []), current.get("files", [])
    if saved.get("format") != current.get("format"):
        return [f"input format {saved.get('format')} -> {current.get('format')}"]
    if len(saved_files) != len(files):
        return [
            f"input has {len(files)} files, the checkpoint's input had {len(saved_files)} "
            f"({_paths(saved_files)})"
        ]
    out = []
    for before, after in zip(saved_files, files, strict=True):
        if same_content(before, after):
            continue
        if before.get("path") == after.get("path"):
            out.append(f"input file {after.get('path')} was modified")
        else:
            out.append(
                f"input file {after.get('path')} differs from {before.get('path')}, "
                "the checkpoint's input"
            )
    return out


def _paths(files: list[Mapping[str, Any]]) -> str:
    return ", ".join(str(item.get("path")) for item in files)


def _show(value: Any) -> str:
    return "unset" if value is None else repr(value)


def adapter_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    out = []
    for name in sorted(set(saved) | set(current)):
        if name not in saved:
            out.append(f"LoRA adapter {name!r} added")
        elif name not in current:
            out.append(f"LoRA adapter {name!r} removed")
        elif saved[name] != current[name]:
            out.append(f"LoRA adapter {name!r} has different files")
    return out
