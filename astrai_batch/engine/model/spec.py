"""What a model spec string names: a local directory, a GGUF file, a packaged alias, a hub id.

Resolution only looks at the file system and the installed packages; nothing is loaded and the
network is never touched, so a typo in a path fails at once instead of as a hub lookup.
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
from astrai_batch.errors import ConfigError, ModelLoadError

SpecKind = Literal["directory", "gguf", "hub"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class ModelSpec:
    """What a model spec resolved to: the name the model goes by and where it is."""

    kind: SpecKind
    name: str
    location: str


def resolve_model_spec(spec: str | os.PathLike[str]) -> ModelSpec:
    """Decide what `spec` names: a local directory or GGUF file, a packaged alias, or a hub id.

    An existing path wins over an alias, and an alias over a hub id. A spec shaped like a path
    (absolute, starting with "." or "~", or ending in ".gguf") that does not exist is reported
    as a missing path rather than tried on the hub.
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
        )
    if not _HUB_ID.match(text):
        raise ModelLoadError(
            f"Model not found: {text!r} is not an existing path, a known model alias "
            f"({alias_list()}) or a Hugging Face hub id"
        )
    return ModelSpec("hub", text, text)


def alias_list() -> str:
    """The model aliases, for messages."""
    return ", ".join(packaged.name for packaged in PACKAGED_MODELS)
