"""Option values written as text: sizes (``2GiB``), error limits (``5%``), column lists,
JSON objects (``--chat-template-kwargs``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from astrai_batch.errors import ConfigError
from astrai_batch.json_types import json_object

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int, name: str = "kv_cache_memory") -> int:
    """Bytes from an int or a string like ``2GiB``, ``512MiB``, ``1.5GB`` or ``1048576``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size like 2GiB or a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1 byte, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a size like 2GiB or a byte count, got {value!r}")
    match = _SIZE_PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{name} must be a size like 2GiB, 512MiB, 1.5GB or a byte count, got {value!r}"
        )
    size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size < 1:
        raise ConfigError(f"{name} must be >= 1 byte, got {value!r}")
    return size


@dataclass(frozen=True)
class ErrorLimit:
    """How many failed rows a job tolerates: a count, or a fraction of all input rows."""

    count: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.fraction is None):
            raise ConfigError("max_errors must be either a count or a fraction, not both")
        if self.count is not None and (
            isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0
        ):
            raise ConfigError(f"max_errors must be a count >= 0, got {self.count!r}")
        if self.fraction is not None and not 0 <= self.fraction <= 1:
            raise ConfigError(f"max_errors as a fraction must be in [0, 1], got {self.fraction}")

    @classmethod
    def parse(cls, value: str | int | float) -> ErrorLimit:
        """``10`` is a count; ``0.05`` or ``5%`` is a fraction of the input's rows."""
        if isinstance(value, bool):
            raise ConfigError(f"max_errors must be a count or a fraction, got {value!r}")
        if isinstance(value, int):
            return cls(count=value)
        if isinstance(value, float):
            return cls(fraction=value)
        if not isinstance(value, str):
            raise ConfigError(f"max_errors must be a count or a fraction, got {value!r}")
        text = value.strip()
        if re.fullmatch(r"\d+", text):
            return cls(count=int(text))
        percent = text.endswith("%")
        number = _float_or_none(text[:-1] if percent else text)
        if number is None:
            raise ConfigError(
                f"max_errors must be a count, a fraction or a percentage, got {value!r}"
            )
        return cls(fraction=number / 100 if percent else number)

    def allowed(self, total_rows: int) -> int:
        """The most failed rows a job over `total_rows` input rows may have."""
        if self.count is not None:
            return self.count
        return math.floor((self.fraction or 0.0) * total_rows)

    def describe(self) -> str:
        if self.count is not None:
            return str(self.count)
        return f"{(self.fraction or 0.0) * 100:g}%"


def parse_columns(value: Any) -> tuple[str, ...]:
    """Keep columns from ``"a,b"`` or a list of names."""
    if isinstance(value, str):
        names = [name.strip() for name in value.split(",")]
        return tuple(name for name in names if name)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ConfigError(f"keep_columns must be a comma-separated string or a list, got {value!r}")


def parse_json_object(value: Any, name: str) -> dict[str, Any]:
    """A JSON object given as text (a flag) or as a table (TOML)."""
    try:
        return json_object(value, name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _float_or_none(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
