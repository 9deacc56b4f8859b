"""Host milliseconds per engine step: everything a step does besides the model forward.

The engine is filled with `num_seqs` sequences of `context` prompt tokens and stepped until
all of them decode; then `steps` decode-only steps are timed. A step's host time is its
wall time inside `EngineCore.step` minus the model forward (`forward_seconds`, which on CUDA
is timed with a device synchronization, so kernels still running count as forward):
scheduling, building the step's batch, sampling and bookkeeping. The headline figure is the
median over the timed steps (a shared machine's stalls hit single steps), the mean is beside
it, and the parts are timed separately too, so a regression names its place.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import GenerationRequest

SAMPLING_MODES = ("greedy", "seeded", "stop")


@dataclass(frozen=True)
class HostOverhead:
    host_ms_per_step: float  # median over the timed steps (robust to a shared machine)
    host_ms_mean: float
    host_cpu_ms_per_step: float  # this thread's CPU time in the same work (median)
    forward_ms_per_step: float
    parts_ms_per_step: dict[str, float]
    num_seqs: int
    context: int
    steps: int
    sampling: str
    numerics: str

    def to_dict(self) -> dict[str, object]:
        return {
            "host_ms_per_step": round(self.host_ms_per_step, 4),
            "host_ms_mean": round(self.host_ms_mean, 4),
            "host_cpu_ms_per_step": round(self.host_cpu_ms_per_step, 4),
            "forward_ms_per_step": round(self.forward_ms_per_step, 4),
            "parts_ms_per_step": {k: round(v, 4) for k, v in self.parts_ms_per_step.items()},
            "num_seqs": self.num_seqs,
            "context": self.context,
            "steps": self.steps,
            "sampling": self.sampling,
            "numerics": self.numerics,
        }


def _params(mode: str, max_tokens: int, index: int) -> SamplingParams:
    if mode == "greedy":
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    if mode == "seeded":
        return SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0.8, top_p=0.95, seed=index
        )
    if mode == "stop":
        # a stop string the random model practically never produces: every step checks it
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop=("\x00never\x00",))
    raise ValueError(f"sampling must be one of {', '.join(SAMPLING_MODES)}, got {mode!r}")


def measure_host_overhead(
    loaded: LoadedModel,
    *,
    num_seqs: int = 256,
    context: int = 512,
    steps: int = 32,
    warmup: int = 4,
    sampling: str = "greedy",
    prefix_groups: int = 0,
    seed: int = 0,
    numerics: str = "invariant",
) -> HostOverhead:
    """`prefix_groups` > 0 makes the prompts share that many common prefixes (half the
    context), so shared-prefix decode attention is planned every step too."""
    vocab = loaded.model.config.vocab_size
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(3, vocab) for _ in range(context // 2)] for _ in range(prefix_groups)
    ]
    # slack for sequences that decode while others wait for shared prefix pages
    max_tokens = warmup + steps + 64
    config = EngineConfig(
        max_num_seqs=num_seqs,
        # one step prefills every prompt, so every sequence decodes from `context` on
        max_num_batched_tokens=max(1024, num_seqs * context),
        max_model_len=context + max_tokens,
        num_pages=num_seqs * (-(-(context + max_tokens) // 16)) + 16,
        numerics=numerics,
    )
    core = EngineCore(loaded, config)
    for i in range(num_seqs):
        head = prefixes[i % prefix_groups] if prefix_groups else []
        prompt = head + [rng.randrange(3, vocab) for _ in range(context - len(head))]
        errors = core.add_request(GenerationRequest(i, prompt, _params(sampling, max_tokens, i)))
        if errors:
            raise RuntimeError(errors[0].error)
    while any(seq.in_prefill for seq in core.scheduler.running) or core.scheduler.waiting:
        core.step()
    for _ in range(warmup):
        core.step()
    parts = _time_parts(core)
    cpu = _cpu_clocks(core)
    host: list[float] = []
    host_cpu: list[float] = []
    forward: list[float] = []
    started = time.perf_counter()
    for _ in range(steps):
        before = core.stats()
        cpu_before = dict(cpu)
        if core.step():
            raise RuntimeError("a sequence finished during the timed steps")
        delta = core.stats() - before
        if delta.steps != 1 or delta.decode_tokens != num_seqs:
            raise RuntimeError("the timed steps were not all full decode steps")
        host.append(delta.busy_seconds - delta.forward_seconds)
        forward.append(delta.forward_seconds)
        spent = {name: cpu[name] - cpu_before[name] for name in cpu}
        host_cpu.append(spent["step"] - spent["forward"] + spent["build"])
    wall = time.perf_counter() - started
    return HostOverhead(
        host_ms_per_step=1000 * statistics.median(host),
        host_ms_mean=1000 * statistics.fmean(host),
        host_cpu_ms_per_step=1000 * statistics.median(host_cpu),
        forward_ms_per_step=1000 * statistics.median(forward),
        parts_ms_per_step={
            **{name: 1000 * seconds / steps for name, seconds in parts.items()},
            "wall": 1000 * wall / steps,
        },
        num_seqs=num_seqs,
        context=context,
        steps=steps,
        sampling=sampling,
        numerics=numerics,
    )


def _time_parts(core: EngineCore) -> dict[str, float]:
    """Wraps the step's parts on this engine instance with wall timers; returns the totals."""
    totals: dict[str, float] = defaultdict(float)
    _wrap(core.scheduler, "schedule", "schedule", totals, time.perf_counter)
    _wrap(core.runner.buffers, "build", "build_batch", totals, time.perf_counter)
    _wrap(core.runner, "_build_batch", "build_batch", totals, time.perf_counter)
    if core.runner.step_sender is not None:  # tensor parallelism: the step to the other ranks
        _wrap(core.runner.step_sender, "send_step", "broadcast", totals, time.perf_counter)
    _wrap(core.scheduler, "after_step", "after_step", totals, time.perf_counter)
    _wrap(core, "_sample", "sample_and_finish", totals, time.perf_counter)
    return totals


def _cpu_clocks(core: EngineCore) -> dict[str, float]:
    """This thread's CPU time in the step, the runner's forward and its batch build: host CPU
    is step - forward + build (the step runs on this thread; waiting for a core, as on a
    shared machine, is not CPU time)."""
    totals: dict[str, float] = defaultdict(float)
    _wrap(core, "step", "step", totals, time.thread_time)
    _wrap(core.runner, "forward", "forward", totals, time.thread_time)
    _wrap(core.runner.buffers, "build", "build", totals, time.thread_time)
    _wrap(core.runner, "_build_batch", "build", totals, time.thread_time)
    if core.runner.step_sender is not None:
        _wrap(core.runner.step_sender, "send_step", "build", totals, time.thread_time)
    for name in ("step", "forward", "build"):
        totals[name] += 0.0
    return totals


def _wrap(owner, attribute: str, name: str, totals: dict[str, float], clock) -> None:
    inner = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        started = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] += clock() - started

    setattr(owner, attribute, wrapper)
