"""What a model spec string names: a local directory, a GGUF file, a packaged alias, a hub id.

Resolution looks at the file system, the installed packages and the local hub cache; nothing
is loaded. The network is touched only for a hub id, by one connection attempt of a few
seconds (`hub_access.hub_reachable`), so a typo fails at once, naming close matches, instead
of after huggingface_hub's retries; a cached hub id loads from the cache when the hub is
offline or cannot be reached.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from astrai_batch.engine.model.gguf import (
    PACKAGED_MODELS,
    find_packaged_alias,
    locate_packaged_gguf,
)
from astrai_batch.engine.model.hub_access import (
    cached_hub_ids,
    cached_snapshot,
    close_matches,
    hub_offline,
    hub_reachable,
    local_model_names,
)
from astrai_batch.errors import ConfigError, ModelLoadError

SpecKind = Literal["directory", "gguf", "hub"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class ModelSpec:
    """What a model spec resolved to: the name the model goes by and where it is."""

    kind: SpecKind
    name: str
    location: str
    # a hub id read from the local cache only (the hub is offline or cannot be reached)
    local_only: bool = False


def resolve_model_spec(spec: str | os.PathLike[str], revision: str | None = None) -> ModelSpec:
    """Decide what `spec` names: a local directory or GGUF file, a packaged alias, or a hub id.

    An existing path wins over an alias, and an alias over a hub id. A spec shaped like a path
    (absolute, starting with "." or "~", or ending in ".gguf") that does not exist is reported
    as a missing path rather than tried on the hub. A hub id (at `revision`) that is not in the
    local cache while the hub is offline or unreachable is refused at once.
    """
    text = os.fspath(spec)
    if not text.strip():
        raise ConfigError("model spec must not be empty")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; to load a GGUF file pass its path, e.g. {path / ggufs[0]}" if ggufs else ""
            raise ModelLoadError(
                f"Model directory {path} is not a Hugging Face model directory "
                f"(no config.json){hint}"
            )
        return ModelSpec("directory", text, str(path.resolve()))
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(
                f"Model file {path} is not a .gguf file; give a model directory "
                "(with config.json), a .gguf file, a model alias or a hub id"
            )
        return ModelSpec("gguf", text, str(path.resolve()))
    packaged = find_packaged_alias(text)
    if packaged is not None:
        return ModelSpec("gguf", packaged.name, str(locate_packaged_gguf(packaged)))
    if os.path.isabs(text) or text.startswith((".", "~")) or text.lower().endswith(".gguf"):
        raise ModelLoadError(
            f"Model not found: there is no file or directory at {os.path.expanduser(text)}"
            + did_you_mean(text)
        )
    if not _HUB_ID.match(text):
        raise ModelLoadError(
            f"Model not found: {text!r} is not an existing path, a known model alias "
            f"({alias_list()}) or a Hugging Face hub id" + did_you_mean(text)
        )
    snapshot = cached_snapshot(text, revision)
    if snapshot is not None and (hub_offline() or not hub_reachable()):
        # Read the cached files as the directory they are: given the hub id, transformers
        # still asks the hub for optional files (adapter_config.json) and retries for 30 s.
        return ModelSpec("hub", text, snapshot, local_only=True)
    if snapshot is None and (hub_offline() or not hub_reachable()):
        why = "the hub is off (HF_HUB_OFFLINE)" if hub_offline() else "the hub cannot be reached"
        raise ModelLoadError(
            f"Model not found: {text!r} is not a local path, a model alias or a cached hub id, "
            f"and {why}" + (did_you_mean(text) or f"; known aliases: {alias_list()}")
        )
    return ModelSpec("hub", text, text)


def suggestions(text: str) -> list[str]:
    """Names close to `text`: model aliases, model directories and .gguf files in the working
    directory (and beside a path-shaped `text`), cached hub ids."""
    candidates = [alias for packaged in PACKAGED_MODELS for alias in sorted(packaged.aliases)]
    candidates += local_model_names(Path("."))
    parent = Path(text).expanduser().parent
    if parent != Path("."):
        candidates += local_model_names(parent)
    candidates += cached_hub_ids()
    return close_matches(text, candidates) or close_matches(Path(text).name, candidates)


def did_you_mean(text: str) -> str:
    """ "; did you mean X?" naming the close matches of `text`, or nothing."""
    found = suggestions(text)
    return f"; did you mean {' or '.join(found)}?" if found else ""


def alias_list() -> str:
    """The model aliases, for messages."""
    return ", ".join(packaged.name for packaged in PACKAGED_MODELS)
