"""The one check for positive-integer settings, shared by every layer's configuration."""

from __future__ import annotations

from astrai_batch.errors import ConfigError


def require_positive_int(name: str, value: object) -> None:
    """Raise `ConfigError` unless `value` is an int (not a bool) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")
