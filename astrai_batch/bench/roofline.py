"""How far a run is from the limit: its weight-GEMM FLOPs against this machine's GEMM peak.

The peak is measured here for the model's dtype and the torch thread count: the fastest of a
few timed 512-row GEMMs at each of the model's linear shapes (the LM head apart: it runs on
the sampled rows only), in FLOP/s. A measurement can only come out low (something else on
the cores), never high, so a bench measures it again between rounds and prices every run at
the highest it saw (`GemmPeak`): on a 2-vCPU Zen 5 one measurement at a bench's start gave
397 GFLOP/s where the same probe gave 676-787 minutes later, which would have put a run at
1.4x a floor it was 2.5x.

The job's weight GEMMs are every token the forward computed (prefill and decode) through the
body's linears, plus the LM head over one row per generated token. Their time at the peak is
the GEMM floor; the share of wall time outside the forward (scheduling, sampling, host work)
comes from the engine's figures.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai_batch.bench.runs import SystemRun

PEAK_ROWS = 512
TIMED = 5


@dataclass(frozen=True)
class Roofline:
    gemm_flops: float  # the run's weight-GEMM FLOPs
    peak_flops_per_second: float  # measured at the start, this dtype and thread count
    wall_seconds: float
    forward_seconds: float | None

    @property
    def floor_seconds(self) -> float:
        return self.gemm_flops / self.peak_flops_per_second

    def line(self) -> str:
        outside = ""
        if self.forward_seconds is not None:
            share = 1 - self.forward_seconds / self.wall_seconds
            outside = f", {share:.0%} of wall outside the forward"
        return (
            f"roofline: {self.gemm_flops / 1e12:.2f} TFLOP of weight GEMMs at a measured peak "
            f"of {self.peak_flops_per_second / 1e9:.0f} GFLOP/s = GEMM floor "
            f"{self.floor_seconds:.2f} s; wall {self.wall_seconds:.2f} s = "
            f"{self.wall_seconds / self.floor_seconds:.2f}x the floor{outside}"
        )


def body_and_head(model: torch.nn.Module) -> tuple[list[tuple[int, int]], int]:
    """(in, out) of every linear of the body, and the LM head's parameter count."""
    head = model.get_output_embeddings()
    body = [
        (m.in_features, m.out_features)
        for m in model.modules()
        if hasattr(m, "in_features") and hasattr(m, "weight") and m is not head
    ]
    return body, head.weight.numel()


class GemmPeak:
    """FLOP/s of a model's body GEMMs at `PEAK_ROWS` rows, in its dtype, measured each time
    `measure` is called: the fastest of `TIMED` runs of all its distinct shapes, summed.
    `best` is the highest measurement so far, the one to price runs at.

    On the CPU it is measured in a child process (`spawn`, the same torch thread count), kept
    until `close` so that measuring again costs no new start: on a 2-vCPU Sapphire Rapids
    (torch 2.13, bfloat16) the engine's next runs in a process that had merely allocated this
    measurement's tensors took 24-26 s where they had taken 12-14 s, for reasons not yet found;
    a bench must not change what it measures. (`spawn` re-imports the caller's `__main__`: a
    script using this needs an `if __name__ == "__main__"` guard.)"""

    def __init__(self, model: torch.nn.Module) -> None:
        param = next(model.parameters())
        self._shapes = sorted(set(body_and_head(model)[0]))
        self._dtype, self._device = param.dtype, param.device
        self._threads = torch.get_num_threads()
        self._pool = None
        self.measurements: list[float] = []

    def measure(self) -> float:
        """One more measurement, returned and kept."""
        if self._device.type != "cpu":
            value = _timed_peak(self._shapes, self._dtype, self._device)
        else:
            if self._pool is None:
                self._pool = multiprocessing.get_context("spawn").Pool(1)
            value = self._pool.apply(_cpu_peak, (self._shapes, self._dtype, self._threads))
        self.measurements.append(value)
        return value

    @property
    def best(self) -> float:
        if not self.measurements:
            raise ValueError("the GEMM peak has not been measured yet")
        return max(self.measurements)

    def describe(self) -> str:
        """'B GFLOP/s (the highest of M1, M2, ...)': every measurement, in the order taken."""
        each = ", ".join(f"{m / 1e9:,.0f}" for m in self.measurements)
        if len(self.measurements) == 1:
            return f"{self.best / 1e9:,.0f} GFLOP/s"
        return f"{self.best / 1e9:,.0f} GFLOP/s (the highest of {each})"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> GemmPeak:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gemm_peak(model: torch.nn.Module) -> float:
    """One measurement of `GemmPeak`, its child process closed after it."""
    with GemmPeak(model) as peak:
        return peak.measure()


def _cpu_peak(shapes: list[tuple[int, int]], dtype: torch.dtype, threads: int) -> float:
    torch.set_num_threads(threads)
    return _timed_peak(shapes, dtype, torch.device("cpu"))


def _timed_peak(shapes: list[tuple[int, int]], dtype: torch.dtype, device: torch.device) -> float:
    generator = torch.Generator().manual_seed(0)
    mats = [
        (
            torch.randn(PEAK_ROWS, k, generator=generator).to(device, dtype),
            torch.randn(n, k, generator=generator).to(device, dtype),
        )
        for k, n in shapes
    ]
    flops = sum(2 * PEAK_ROWS * k * n for k, n in shapes)
    best = float("inf")
    with torch.inference_mode():
        for a, w in mats:  # warm-up: oneDNN builds its kernels on first use
            F.linear(a, w)
        _synchronize(device)
        for _ in range(TIMED):
            start = time.perf_counter()
            for a, w in mats:
                F.linear(a, w)
            _synchronize(device)  # CUDA returns before its kernels ran
            best = min(best, time.perf_counter() - start)
    return flops / best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def roofline(model: torch.nn.Module, run: SystemRun, peak: float, prompts: int) -> Roofline:
    """The run's weight GEMMs: prefill tokens and one decode token per generated token after
    each prompt's first through the body, one LM-head row per generated token."""
    body, head = body_and_head(model)
    per_token = 2 * sum(k * n for k, n in body)
    engine = run.engine
    prefill = engine.prefill_tokens if engine is not None else run.prompt_tokens
    decode = run.generated_tokens - prompts
    flops = per_token * (prefill + decode) + 2 * head * run.generated_tokens
    forward = engine.forward_seconds if engine is not None else None
    return Roofline(flops, peak, run.wall_seconds, forward)
