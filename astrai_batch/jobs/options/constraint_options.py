"""The job-wide output constraint: ``--json-schema FILE``, ``--regex PATTERN``,
``--choice a,b,c`` or ``--grammar FILE`` (at most one). It becomes the default `constraint`
of every row; a row's own ``json_schema`` / ``regex`` / ``choice`` / ``grammar`` column or
``response_format`` replaces it. Values are checked with the same rules, and turned into the
same canonical text, as the row columns, so a row repeating the job schema shares its grammar.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astrai_batch.engine.sampling.constraints import Constraint
from astrai_batch.errors import ConfigError
from astrai_batch.io.constraint_fields import constraint_override
from astrai_batch.io.rows import CONSTRAINT_COLUMNS, RowProblem

CONSTRAINT_OPTIONS = CONSTRAINT_COLUMNS  # json_schema, regex, choice, grammar
_FILE_OPTIONS = ("json_schema", "grammar")


def job_constraint(options: Mapping[str, Any]) -> Constraint | None:
    """The constraint named by the (underscore-keyed) options, or None."""
    given = [name for name in CONSTRAINT_OPTIONS if options.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in given)
        raise ConfigError(f"only one job-wide constraint may be given, got {flags}")
    name = given[0]
    value = options[name]
    flag = f"--{name.replace('_', '-')}"
    if name in _FILE_OPTIONS:
        value = _read_file(flag, value)
    elif name == "choice" and isinstance(value, str):
        value = [option.strip() for option in value.split(",")]
    try:
        override = constraint_override({name: value})
    except RowProblem as problem:
        raise ConfigError(f"{flag}: {problem}") from None
    return Constraint.from_dict(override["constraint"])


def _read_file(flag: str, path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{flag} must be a file path, got {path!r}")
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{flag}: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc}") from None
