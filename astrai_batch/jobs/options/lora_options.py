"""The job's LoRA options: `--lora NAME=PATH` (repeatable) or a TOML `[lora]` table of
name = path, `--max-loras` and `--max-lora-rank`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from astrai_batch.errors import ConfigError
from astrai_batch.json_types import json_type

# vLLM's --max-lora-rank default is 16; ours admits the common ranks up to 64.
DEFAULT_MAX_LORA_RANK = 64
# Every adapter of a job stays resident (no swapping), so this caps the adapters of a job.
DEFAULT_MAX_LORAS = 8
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def parse_lora(value: Any) -> tuple[tuple[str, str], ...]:
    """(name, path) pairs from a [lora] table, or from NAME=PATH strings (the flag)."""
    if isinstance(value, Mapping):
        pairs = [(str(name), path) for name, path in value.items()]
    elif isinstance(value, (list, tuple)):
        pairs = [_split(item) for item in value]
    else:
        raise ConfigError(f"lora must be NAME=PATH entries or a table, got {json_type(value)}")
    for name, path in pairs:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"lora adapter {name!r} needs a path, got {json_type(path)}")
    return tuple(pairs)


def _split(item: Any) -> tuple[str, str]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"--lora takes NAME=PATH, got {item!r}")
    name, _, path = item.partition("=")
    return name.strip(), path.strip()


def check_lora_options(lora: tuple[tuple[str, str], ...], max_loras: int) -> None:
    names = [name for name, _ in lora]
    for name in names:
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"lora adapter name {name!r} must start with a letter or digit and hold only "
                "letters, digits and . _ : / -"
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"lora adapter name(s) given twice: {', '.join(repeated)}")
    if len(lora) > max_loras:
        raise ConfigError(
            f"{len(lora)} LoRA adapters given but --max-loras is {max_loras} (every adapter "
            "of a job stays loaded); raise --max-loras"
        )
