"""The checks of a setting's type shared by every layer's configuration."""

from __future__ import annotations

from astrai_batch.errors import ConfigError
from astrai_batch.json_types import json_type


def require_positive_int(name: str, value: object) -> None:
    """Raise `ConfigError` unless `value` is an integer (not a boolean) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {json_type(value)}")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")


def require_type(name: str, value: object, expected: type[str] | type[bool]) -> None:
    """Raise `ConfigError` unless `value` is a string or a boolean, as `expected` says (an
    integer is no boolean here, and a boolean no string)."""
    if (expected is not bool and isinstance(value, bool)) or not isinstance(value, expected):
        wanted = "a boolean" if expected is bool else "a string"
        raise ConfigError(f"{name} must be {wanted}, got {json_type(value)}")
