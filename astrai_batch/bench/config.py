"""What one `astrai-batch bench` invocation measures, validated before any model loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from astrai_batch.checks import require_positive_int
from astrai_batch.engine.config import KV_LAYOUTS, EngineConfig
from astrai_batch.engine.device_choice import AUTO, resolve_device_name, resolve_dtype_name
from astrai_batch.errors import ConfigError, ModelLoadError

OURS = "astrai"
HF_GENERATE = "hf-generate"
HF_GENERATE_BATCH = "hf-generate-batch"
HF_SCORE_PAIRS = "hf-score-pairs"  # the scoring workload's peer: one forward per pair
# llama.cpp on the model's GGUF (`llama_cpp_peer`): the optional extra `llama-cpp`, so it is
# never among the default peers.
LLAMA_CPP = "llama-cpp"
FLOOR = "floor"
GENERATE_PEERS = (HF_GENERATE, HF_GENERATE_BATCH)
PEER_NAMES = (*GENERATE_PEERS, LLAMA_CPP, HF_SCORE_PAIRS)
# The log-likelihood workload (`score_bench`): token ids, so it is not a `workloads` text
# workload; its peer is hf-score-pairs, and it has no floor line.
SCORING = "scoring"
SCORE_PEER_BATCH_SIZE = 8  # hf-score-pairs' batch when --hf-batch-size is auto
DEFAULT_TOLERANCE = 0.05
# transformers `generate` is run the way a careful script runs it: prompts sorted by length,
# fixed batches, left-padded; with `hf_generate_batch_size` None (auto) the batch size is the
# fastest of these on a short probe, as the floor's sizes are chosen.
HF_GENERATE_BATCH_SIZES = (16, 32, 64, 128)
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
    peers: tuple[str, ...] = GENERATE_PEERS
    max_tokens: int | None = None
    num_system_prompts: int | None = None
    questions_per_prompt: int | None = None
    system_prompt_words: int | None = None
    seed: int = 0
    device: str = AUTO  # resolved in __post_init__: cuda when available, else cpu
    dtype: str = AUTO  # resolved: `device_choice.choose_dtype`
    revision: str | None = None
    trust_remote_code: bool = False
    threads: int | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    hf_generate_batch_size: int | None = None  # None: the fastest of HF_GENERATE_BATCH_SIZES
    kv_layouts: tuple[str, ...] = ("paged",)  # our engine runs once per layout per repeat
    warmup: bool = True
    floor: bool = True
    tensor_parallel_size: int = 1  # our engine over this many ranks (engine/parallel)
    tp_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("model", "workload", "device", "dtype"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        object.__setattr__(self, "device", resolve_device_name(self.device))
        object.__setattr__(self, "dtype", resolve_dtype_name(self.dtype, self.device))
        if self.revision is not None and (not isinstance(self.revision, str) or not self.revision):
            raise ConfigError(f"revision must be a non-empty string, got {self.revision!r}")
        if not isinstance(self.trust_remote_code, bool):
            raise ConfigError(
                f"trust_remote_code must be true or false, got {self.trust_remote_code!r}"
            )
        require_positive_int("repeat", self.repeat)
        for name in (
            "threads",
            "hf_generate_batch_size",
            "max_tokens",
            "num_system_prompts",
            "questions_per_prompt",
            "system_prompt_words",
        ):
            if getattr(self, name) is not None:
                require_positive_int(name, getattr(self, name))
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
        self._check_scoring()
        if LLAMA_CPP in self.peers:
            self._check_llama_cpp()
        if not isinstance(self.kv_layouts, tuple) or not self.kv_layouts:
            raise ConfigError(f"kv_layouts must name at least one layout, got {self.kv_layouts!r}")
        for layout in self.kv_layouts:
            if layout not in KV_LAYOUTS:
                raise ConfigError(
                    f"kv layout: unknown layout {layout!r}; known layouts: {', '.join(KV_LAYOUTS)}"
                )
        if len(set(self.kv_layouts)) != len(self.kv_layouts):
            raise ConfigError(f"kv layout: {', '.join(self.kv_layouts)} names a layout twice")
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")
        for name in ("warmup", "floor"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        require_positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.tensor_parallel_size > 1 and (self.peers or self.floor):
            raise ConfigError(
                "--tensor-parallel-size > 1 benchmarks our engine only (the peers and the "
                "floor run the whole model in one process): add --peers none --no-floor"
            )

    def _check_scoring(self) -> None:
        """The scoring workload generates nothing: its own peer, no floor, no max_tokens."""
        if self.workload != SCORING:
            if HF_SCORE_PAIRS in self.peers:
                raise ConfigError(f"peers: {HF_SCORE_PAIRS} runs with --workload {SCORING} only")
            return
        others = [peer for peer in self.peers if peer != HF_SCORE_PAIRS]
        if others:
            raise ConfigError(
                f"peers: {others[0]} generates; --workload {SCORING} compares with "
                f"{HF_SCORE_PAIRS} only"
            )
        if self.max_tokens is not None:
            raise ConfigError(f"--max-tokens does not apply to --workload {SCORING}")
        if self.tensor_parallel_size > 1:
            raise ConfigError(f"--workload {SCORING} runs with --tensor-parallel-size 1")

    def _check_llama_cpp(self) -> None:
        """The extra installed, a GGUF model, the CPU: refused here, before any model loads."""
        from astrai_batch.bench.llama_cpp_peer import check_llama_cpp_peer

        try:
            check_llama_cpp_peer(self.model, self.device)
        except ModelLoadError as exc:  # the packaged GGUF's package is missing
            raise ConfigError(f"peers: {LLAMA_CPP}: {exc}") from exc

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
        for name in ("peers", "kv_layouts"):
            if isinstance(converted.get(name), list):
                converted[name] = tuple(converted[name])
        return cls(**converted)


def ours_system(kv_layout: str) -> str:
    """Our engine's system name in results: `astrai` for the paged layout, else suffixed."""
    return OURS if kv_layout == "paged" else f"{OURS}-{kv_layout}"


OURS_SYSTEMS = tuple(ours_system(layout) for layout in KV_LAYOUTS)


def parse_kv_layouts(text: str) -> tuple[str, ...]:
    """'contiguous,paged' -> ('contiguous', 'paged'), in the order given (the run order)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_batch_size(text: str) -> int | None:
    """'auto' -> None (probe for the fastest), else a positive int."""
    if text.strip() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"hf batch size must be auto or a positive int, got {text!r}") from None
    require_positive_int("hf batch size", value)
    return value


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
