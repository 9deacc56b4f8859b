"""What one `astrai-batch bench` invocation measures, validated before any model loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from astrai_batch.engine.config import EngineConfig
from astrai_batch.errors import ConfigError

OURS = "astrai"
HF_GENERATE = "hf-generate"
HF_GENERATE_BATCH = "hf-generate-batch"
FLOOR = "floor"
PEER_NAMES = (HF_GENERATE, HF_GENERATE_BATCH)
DEFAULT_TOLERANCE = 0.05
# transformers `generate` is run the way most scripts run it: fixed batches, left-padded.
HF_GENERATE_BATCH_SIZE = 32
# The warm-up touches every code path once (allocators, kernels, tokenizer caches) on a few
# short prompts, so the first measured run is not also the first run of the process.
WARMUP_PROMPTS = 4
WARMUP_MAX_TOKENS = 4


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: a model, a prompt set, how often to repeat, and whom to compare with.

    `workload` is a built-in workload name or the path of an input file `run` accepts.
    `max_tokens` None means the built-in workload's preset (64 for files). The workload sizes
    (`num_system_prompts` ...) apply to built-in workloads only; None keeps their presets.
    """

    model: str
    workload: str = "shared-prefix"
    repeat: int = 1
    peers: tuple[str, ...] = PEER_NAMES
    max_tokens: int | None = None
    num_system_prompts: int | None = None
    questions_per_prompt: int | None = None
    system_prompt_words: int | None = None
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    revision: str | None = None
    trust_remote_code: bool = False
    threads: int | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    hf_generate_batch_size: int = HF_GENERATE_BATCH_SIZE
    warmup: bool = True
    floor: bool = True

    def __post_init__(self) -> None:
        for name in ("model", "workload", "device", "dtype"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        if self.revision is not None and (not isinstance(self.revision, str) or not self.revision):
            raise ConfigError(f"revision must be a non-empty string, got {self.revision!r}")
        if not isinstance(self.trust_remote_code, bool):
            raise ConfigError(
                f"trust_remote_code must be true or false, got {self.trust_remote_code!r}"
            )
        _positive("repeat", self.repeat)
        if self.threads is not None:
            _positive("threads", self.threads)
        _positive("hf_generate_batch_size", self.hf_generate_batch_size)
        for name in ("max_tokens", "num_system_prompts", "questions_per_prompt"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.system_prompt_words is not None:
            _positive("system_prompt_words", self.system_prompt_words)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {self.seed!r}")
        if not isinstance(self.peers, tuple):
            raise ConfigError(f"peers must be a tuple of names, got {type(self.peers).__name__}")
        unknown = [peer for peer in self.peers if peer not in PEER_NAMES]
        if unknown:
            raise ConfigError(
                f"peers: unknown peer {unknown[0]!r}; known peers: {', '.join(PEER_NAMES)}"
            )
        if len(set(self.peers)) != len(self.peers):
            raise ConfigError(f"peers: {', '.join(self.peers)} names a peer twice")
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")
        for name in ("warmup", "floor"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BenchConfig:
        """From plain values; `engine` may be a dict of `EngineConfig` options."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown bench option(s): {', '.join(unknown)}")
        converted = dict(values)
        if isinstance(converted.get("engine"), Mapping):
            converted["engine"] = EngineConfig.from_dict(converted["engine"])
        if isinstance(converted.get("peers"), list):
            converted["peers"] = tuple(converted["peers"])
        return cls(**converted)


def parse_peers(text: str) -> tuple[str, ...]:
    """'hf-generate,hf-generate-batch' -> a tuple; '' or 'none' -> no peers."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if names == ("none",):
        return ()
    return names


def parse_tolerance(text: str | float) -> float:
    """'5%' or '0.05' -> 0.05; must lie in [0, 1)."""
    if isinstance(text, bool):
        raise ConfigError(f"tolerance must be like 5% or 0.05, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        stripped = text.strip()
        try:
            value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
        except ValueError:
            raise ConfigError(f"tolerance must be like 5% or 0.05, got {text!r}") from None
    if not 0 <= value < 1:
        raise ConfigError(f"tolerance must be at least 0% and below 100%, got {text!r}")
    return value


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")
