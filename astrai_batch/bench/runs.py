"""What one timed run of one system yields, whichever system it was."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from astrai_batch.errors import AstraiBatchError


def compact_json(values: dict) -> str:
    """A run's `system_config`: its settings as one sorted, compact JSON object."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class EngineFigures:
    """What only our engine reports about a run."""

    prefill_tokens: int  # prompt tokens run through the model (recomputation included)
    cache_hit_rate: float  # prompt tokens served from the prefix cache / tokens looked up
    ttft_p50_seconds: float  # time to first token, from submission to the engine
    ttft_p90_seconds: float
    peak_kv_pages: int
    kv_pool_pages: int
    kv_layout: str  # paged | contiguous
    attention_backend: str  # what `auto` resolved to, or the backend named
    kv_seats: int | None  # contiguous: the seats the pool was cut into; paged: None
    peak_running_seqs: int  # the most sequences running at once: what fit in the KV memory
    forward_seconds: float  # inside the model forward
    step_seconds: float  # inside engine steps: the forward plus scheduling and sampling
    steps: int
    preemptions: int


@dataclass(frozen=True)
class SystemRun:
    """One system over the whole prompt set. `repeat` is None for warm-up runs."""

    system: str
    repeat: int | None
    wall_seconds: float
    prompt_tokens: int
    generated_tokens: int
    peak_rss_bytes: int | None
    system_config: str  # how the system was configured, as compact JSON
    engine: EngineFigures | None = None
    # each prompt's generated token ids in input order, where the system gives them: the
    # greedy agreement between systems is computed from them
    token_ids: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.wall_seconds) and self.wall_seconds > 0):
            raise ValueError(f"wall_seconds must be a positive number, got {self.wall_seconds}")
        if self.prompt_tokens < 0 or self.generated_tokens < 0:
            raise ValueError("token counts must be non-negative")

    @property
    def generated_tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds

    @property
    def total_tokens_per_second(self) -> float:
        """Prompt plus generated tokens per second, as vLLM's offline benchmark counts them."""
        return (self.prompt_tokens + self.generated_tokens) / self.wall_seconds

    @property
    def engine_overhead(self) -> float | None:
        """The share of wall time spent outside the model forward."""
        if self.engine is None:
            return None
        return 1.0 - self.engine.forward_seconds / self.wall_seconds


def check_generated(system: str, lengths: Sequence[int], max_tokens: int) -> int:
    """Total generated tokens, after checking every prompt got exactly `max_tokens`.

    The comparison is only fair when every system does the same work, so a system that
    stops early (an end-of-sequence token it was meant to ignore) fails the benchmark.
    """
    short = [(index, length) for index, length in enumerate(lengths) if length != max_tokens]
    if short:
        index, length = short[0]
        raise AstraiBatchError(
            f"{system} generated {length} tokens for prompt {index} instead of {max_tokens} "
            f"({len(short)} of {len(lengths)} prompts differ); the comparison needs equal work"
        )
    return max_tokens * len(lengths)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (numpy's default), `fraction` in [0, 1]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
