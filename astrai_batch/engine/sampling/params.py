"""How one request is decoded: the sampling parameters and their validation.

This module deliberately imports no torch, so job configuration and input parsing can build
and validate `SamplingParams` without loading the engine. Values come from flags, TOML and
input rows, so errors name types as JSON does (``stop must be a string or a list of
strings, got integer``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astrai_batch.engine.sampling.constraints.spec import Constraint
from astrai_batch.errors import ConfigError
from astrai_batch.json_types import first_non_count, json_type

SEED_LIMIT = 2**63

_INT_FIELDS = ("n", "max_tokens", "min_tokens", "top_k", "seed", "top_logprobs", "prompt_logprobs")
MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_BOOL_FIELDS = ("ignore_eos", "logprobs")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Decoding settings of one request; every sample of the request shares them.

    Semantics follow Hugging Face `generate` where the two differ from OpenAI's API:
    `repetition_penalty` is HF's (over prompt and generated tokens, positive logits divided,
    negative ones multiplied); `presence_penalty` and `frequency_penalty` are OpenAI's (over
    generated tokens only, subtracted from the logits). `constraint` restricts the output to
    a JSON schema, regex, choice or grammar (see `engine.constraints`).
    """

    n: int = 1
    max_tokens: int = 256
    min_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    constraint: Constraint | None = None
    # OpenAI's top_logprobs: per generated token its N most likely alternatives (0: none)
    top_logprobs: int = 0
    # vLLM's prompt_logprobs: every prompt token's logprob and N alternatives (None: off)
    prompt_logprobs: int | None = None
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs in id order, added to the
    # model's logits before penalties and masks (`logit_bias`); given as {id: bias} too
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        self._check_types()
        self._check_ranges()
        self._check_stops()
        self._check_constraint()
        object.__setattr__(self, "logit_bias", logit_bias_pairs(self.logit_bias))

    def _check_types(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if name in ("seed", "prompt_logprobs") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {json_type(value)}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number, got {json_type(value)}")
            if not math.isfinite(value):
                raise ConfigError(f"{name} must be finite, got {value}")
            # Ints are accepted for convenience but stored as floats, so equal settings compare
            # and print the same whichever way they were written.
            object.__setattr__(self, name, float(value))
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be a boolean, got {json_type(value)}")

    def _check_ranges(self) -> None:
        if self.n < 1:
            raise ConfigError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ConfigError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ConfigError(f"{name} must be in [-2, 2], got {value}")
        for name in ("top_logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ConfigError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"seed must be in [0, 2**63), got {self.seed}")

    def _check_stops(self) -> None:
        # A single string and lists are accepted and stored as tuples, like from_dict does.
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (tuple, list)):
            raise ConfigError(
                f"stop must be a string or a list of strings, got {json_type(self.stop)}"
            )
        for position, text in enumerate(stop):
            if not isinstance(text, str):
                raise ConfigError(f"stop[{position}] must be a string, got {json_type(text)}")
            if not text:
                raise ConfigError(f"stop[{position}] is empty")
        object.__setattr__(self, "stop", tuple(stop))
        token_ids = self.stop_token_ids
        if not isinstance(token_ids, (tuple, list)):
            raise ConfigError(
                f"stop_token_ids must be a list of integers, got {json_type(token_ids)}"
            )
        bad = first_non_count(token_ids)
        if bad is not None:
            raise ConfigError(
                f"stop_token_ids[{bad[0]}] must be a non-negative integer, got {bad[1]}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(token_ids))

    def _check_constraint(self) -> None:
        if self.constraint is None:
            return
        if not isinstance(self.constraint, Constraint):
            raise ConfigError(
                f"constraint must be a Constraint, got {type(self.constraint).__name__}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Builds validated parameters from e.g. a parsed TOML/JSON table.

        Unknown keys are rejected; `stop` may be a single string or a list, `stop_token_ids` a
        list; missing keys take their defaults.
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"sampling params must be an object, got {json_type(values)}")
        return cls(**_coerced(values))

    def replace(self, **overrides: Any) -> SamplingParams:
        """A copy with some fields changed, validated like `from_dict`."""
        return dataclasses.replace(self, **_coerced(overrides))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples as lists) that `from_dict` turns back into equal params."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Constraint):
                value = value.to_dict()
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def greedy(self) -> bool:
        """Temperature 0: the next token is the argmax; top-k/top-p/min-p and seed are unused."""
        return self.temperature == 0.0


def logit_bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (ids as JSON's string keys or ints) or (id, bias) pairs, checked, as
    pairs in id order."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = [tuple(pair) if isinstance(pair, (list, tuple)) else (pair,) for pair in value]
    else:
        raise ConfigError(f"logit_bias must be an object of token id: bias, got {json_type(value)}")
    pairs: dict[int, float] = {}
    for item in items:
        if len(item) != 2:
            raise ConfigError("logit_bias must be an object of token id: bias")
        key, bias = item
        token = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ConfigError(f"logit_bias keys must be token ids, got {key!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise ConfigError(f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r}")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _coerced(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values as keyword arguments; unknown names are refused (`__post_init__` turns
    a single stop string and lists into tuples)."""
    known = {field.name for field in dataclasses.fields(SamplingParams)}
    unknown = sorted(str(key) for key in values if key not in known)
    if unknown:
        raise ConfigError(f"unknown sampling field(s): {', '.join(unknown)}")
    out = dict(values)
    if out.get("constraint") is not None:
        out["constraint"] = Constraint.from_dict(out["constraint"])
    return out
