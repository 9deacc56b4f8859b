"""How many bytes the KV pool gets when `--kv-cache-memory` does not say.

On CUDA, vLLM's rule (and the meaning of its `--gpu-memory-utilization`): the pool takes what
is left of `utilization x total GPU memory` once the weights, the activation peak of the
worst step and the CUDA graphs' pool are paid for. The peak is profiled
(`profile_activation_peak`): the largest prefill and the worst decode step the configuration
allows, over scratch pools, measured with the allocator's peak counter.

On CPU, a share of the RAM available when the engine starts (MemAvailable: free plus
reclaimable page cache), so a 24 GiB machine does not preempt on a fixed 2 GiB pool and a
small one is not pushed into swap.

Either way the pool is never larger than `max_num_seqs` sequences of the full context can use.
The arithmetic is pure functions of the measured numbers, so it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.errors import ConfigError

# Of MemAvailable at start. The CPU pool becomes resident as its pages are written (lazy
# zeros), so a small job stays small; a long one may fill it, and the rest stays for a step's
# activations (GBs for a 1B model at 1024 tokens in float32), I/O and whatever else runs.
CPU_RAM_SHARE = 0.3
_MEMINFO = Path("/proc/meminfo")
GIB = 1024**3


def gpu_kv_budget(
    *, total_bytes: int, utilization: float, weights_bytes: int, activation_peak_bytes: int
) -> int:
    """Bytes for the KV pool: utilization x total, less the weights and the activation peak."""
    if not 0 < utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
    allowed = int(total_bytes * utilization)
    budget = allowed - weights_bytes - activation_peak_bytes
    if budget <= 0:
        raise ConfigError(
            f"gpu_memory_utilization {utilization} leaves no room for the KV cache: "
            f"{_gib(allowed)} of {_gib(total_bytes)} allowed, the weights take "
            f"{_gib(weights_bytes)} and a step's activations {_gib(activation_peak_bytes)}; "
            "raise --gpu-memory-utilization, lower --max-num-batched-tokens, "
            "or set --kv-cache-memory"
        )
    return budget


def cpu_kv_budget(available_bytes: int) -> int:
    return int(available_bytes * CPU_RAM_SHARE)


def capped(budget: int, *, bytes_per_page: int, max_num_seqs: int, pages_per_seq: int) -> int:
    """Never more than `max_num_seqs` full-length sequences can use."""
    return min(budget, bytes_per_page * max_num_seqs * pages_per_seq)


def available_ram() -> int:
    """Bytes of RAM available to new allocations now (psutil, else /proc/meminfo)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        for line in _MEMINFO.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_kv_budget(
    device: torch.device,
    *,
    gpu_memory_utilization: float,
    profile_activation_peak: Callable[[], int],
) -> int:
    """The uncapped default budget for `device` (see the module docstring)."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        weights = torch.cuda.memory_allocated(device)
        peak = profile_activation_peak()
        return gpu_kv_budget(
            total_bytes=total,
            utilization=gpu_memory_utilization,
            weights_bytes=weights,
            activation_peak_bytes=peak,
        )
    return cpu_kv_budget(available_ram())


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def profile_activation_peak(
    model: torch.nn.Module,
    pool_args: dict,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    numerics: str = "invariant",
    graphs: bool = False,
) -> int:
    """The bytes the worst step allocates beyond what is allocated before it, plus the CUDA
    graphs' memory pool when graphs are captured (`profile_step_peaks`). The graphs' pool
    holds the activations of the largest bucket, which is the worst decode step: it is
    reserved once more."""
    prefill, decode = profile_step_peaks(
        model,
        pool_args,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        numerics=numerics,
    )
    return max(prefill, decode) + (decode if graphs else 0)


def profile_step_peaks(
    model: torch.nn.Module,
    pool_args: dict,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    numerics: str = "invariant",
) -> tuple[int, int]:
    """(prefill, decode): the peak bytes of the largest prefill (`max_num_batched_tokens`
    tokens over up to `max_num_seqs` sequences, all wanting logits, so the LM head's output is
    as large as it gets) and of the worst decode (`worst_decode_chunks`, the cascade off so
    nothing is shared: no block attention's cascade, no flash key block read once for
    several decodes, whatever the probed block), each over a scratch pool freed afterwards
    (`measure_peak`)."""
    from astrai_batch.cache.kv_pool import KVPool
    from astrai_batch.engine.runner.model_runner import ModelRunner

    device = torch.device(pool_args["device"])
    page_size = pool_args["page_size"]
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    per_seq = min(-(-max_num_batched_tokens // seqs), max_model_len)
    pages_per_seq = -(-per_seq // page_size)
    prefill = [
        ScheduledChunk([0] * per_seq, 0, range(i * pages_per_seq, (i + 1) * pages_per_seq), True)
        for i in range(seqs)
    ]
    pages, decode = worst_decode_chunks(max_num_seqs, max_model_len, page_size)
    peaks = []
    for num_pages, chunks in ((seqs * pages_per_seq, prefill), (pages, decode)):
        scratch = KVPool(num_pages=num_pages, **pool_args)
        runner = ModelRunner(model, scratch, numerics=numerics, use_cascade=False)
        peaks.append(measure_peak(device, lambda r=runner, c=chunks: r.forward(c)))
        del runner, scratch
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return peaks[0], peaks[1]


def measure_peak(device: torch.device, run: Callable[[], object]) -> int:
    """The most bytes `run` holds allocated at once beyond what was allocated before it:
    the CUDA allocator's peak counter, or on CPU torch's profiler's allocation events."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
        del result  # what the step returns counts until it is dropped, as on CUDA
    held = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def worst_decode_chunks(max_num_seqs: int, max_model_len: int, page_size: int):
    """(pages, chunks): the decode step with the most key/value gathers the configuration
    allows, `max_num_seqs` decodes at position `max_model_len - 1`. Every sequence's table
    names the same pages, so the scratch pool is one context long; what is measured is the
    gathers, which copy each sequence's context whoever else reads it."""
    pages = -(-max_model_len // page_size)
    table = range(pages)
    chunks = [
        ScheduledChunk([0], max_model_len - 1, table, True, seq_key=i, pages_version=0)
        for i in range(max_num_seqs)
    ]
    return pages, chunks
