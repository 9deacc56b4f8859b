"""Reading the job TOML file given with ``--config``: its top-level options, unchecked.

The options it returns are checked by `JobConfig.from_options`, as flags are; only the
file's shape (readable, valid TOML, no nested tables but JSON-object options) is checked here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.option_groups import TABLE_OPTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


def load_toml_options(path: str | Path) -> dict[str, Any]:
    """The options table of a job TOML file (top-level keys; no nested tables)."""
    config_path = Path(path)
    try:
        with config_path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {config_path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {config_path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {config_path} is not valid TOML: {exc}") from exc
    tables = sorted(
        key
        for key, value in data.items()
        if isinstance(value, dict) and key.replace("-", "_") not in TABLE_OPTIONS
    )
    if tables:
        raise ConfigError(
            f"config file {config_path} must hold top-level options only, "
            f"found table(s): {', '.join(tables)}"
        )
    return data
