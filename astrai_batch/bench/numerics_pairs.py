"""Invariant and fast numerics run alternately on one loaded model: what invariance costs.

Used by scripts/bench_numerics.py (the default model, with a roofline per run) and
scripts/bench_moe_numerics.py (a mixture-of-experts model at real shapes); `round_order` by
scripts/bench_llama_cpp.py as well."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.runs import SystemRun
from astrai_batch.engine import EngineConfig, LoadedModel

MODES = ("invariant", "fast")
T = TypeVar("T")


def round_order(names: Sequence[T], round_: int) -> tuple[T, ...]:
    """The order in which round `round_` runs `names`: rotated by one a round, so over as many
    rounds as names each one runs once in each position. A fixed order biases the ratios: a run
    right after a large one finds that run's freed memory still mapped by the host (measured on a
    Firecracker guest: ~8 us a page for a first write otherwise), and its caches and clock
    differ."""
    if not names:
        return ()
    shift = round_ % len(names)
    return (*names[shift:], *names[:shift])


def workload_config(model: str, workload: str, args) -> BenchConfig:
    """The bench configuration of `workload` from the numerics scripts' shared options
    (`args`: --max-tokens, --num-system-prompts, --questions-per-prompt,
    --system-prompt-words)."""
    return BenchConfig(
        model=model,
        workload=workload,
        max_tokens=args.max_tokens,
        num_system_prompts=args.num_system_prompts,
        questions_per_prompt=args.questions_per_prompt,
        system_prompt_words=args.system_prompt_words,
    )


def alternate_numerics(
    loaded: LoadedModel,
    prompts: BenchPrompts,
    workload: str,
    *,
    repeat: int,
    warmup: BenchPrompts,
    note: Callable[[SystemRun], str] | None = None,
) -> dict[str, list[float]]:
    """Wall seconds per mode over `repeat` rounds (invariant then fast, fast then invariant, ...:
    `round_order`), after one warm-up run of each on `warmup`; each run printed with
    `note(run)` after it."""
    modes = {name: replace(EngineConfig(), numerics=name) for name in MODES}
    for engine in modes.values():
        run_ours(loaded, warmup, engine, None)
    walls: dict[str, list[float]] = {name: [] for name in modes}
    for round_ in range(repeat):
        for name in round_order(tuple(modes), round_):
            run = run_ours(loaded, prompts, modes[name], round_)
            walls[name].append(run.wall_seconds)
            extra = f"; {note(run)}" if note is not None else ""
            print(
                f"{workload} {name} repeat {round_ + 1}: {run.wall_seconds:.2f} s, "
                f"{run.generated_tokens_per_second:.1f} generated tokens/s{extra}",
                flush=True,
            )
    return walls


def print_ratio(workload: str, prompts: BenchPrompts, walls: dict[str, list[float]]) -> None:
    """The workload's medians and the median of the rounds' invariant / fast ratios."""
    ratios = [i / f for i, f in zip(walls["invariant"], walls["fast"], strict=True)]
    print(
        f"{workload}: {prompts.num_prompts} prompts, {prompts.prompt_tokens} prompt tokens, "
        f"median wall invariant {statistics.median(walls['invariant']):.2f} s, "
        f"fast {statistics.median(walls['fast']):.2f} s, invariant/fast "
        f"{statistics.median(ratios):.3f} (rounds {', '.join(f'{r:.3f}' for r in ratios)})",
        flush=True,
    )
