"""One benchmark end to end: load, warm up, alternate the systems, price the floor.

Order matters for fairness: in every repeat our engine runs first (once per KV layout, in
the order given) and then each peer, so a machine that slows down (another job starting on
the same cores) weighs on both sides of each repeat's ratio. The hf-generate batch size is
probed once after the warm-up, when not given; the floor is measured last, once. The
roofline's GEMM peak is measured at the start and after every repeat, and every run is
priced at the highest measurement (`roofline.GemmPeak`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch

from astrai_batch.bench.config import (
    HF_GENERATE,
    HF_GENERATE_BATCH,
    HF_GENERATE_BATCH_SIZES,
    LLAMA_CPP,
    SCORING,
    WARMUP_MAX_TOKENS,
    WARMUP_PROMPTS,
    BenchConfig,
    ours_system,
)
from astrai_batch.bench.floor import measure_floor
from astrai_batch.bench.greedy_agreement import agreement
from astrai_batch.bench.llama_cpp_peer import gguf_path
from astrai_batch.bench.llama_cpp_process import LlamaCppProcess
from astrai_batch.bench.machine import MachineInfo, load_average, machine_info
from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.peers import (
    BatchSizeChoice,
    choose_hf_batch_size,
    run_hf_generate,
    run_hf_generate_batch,
)
from astrai_batch.bench.prompts import BenchPrompts, load_prompts
from astrai_batch.bench.results import MeasuredRun, result_row
from astrai_batch.bench.roofline import GemmPeak, Roofline, roofline
from astrai_batch.bench.runs import SystemRun
from astrai_batch.bench.score_session import measure_scoring
from astrai_batch.engine import LoadedModel, keep_freed_memory, load_model, set_cpu_threads
from astrai_batch.engine.threads import describe_threads
from astrai_batch.errors import AstraiBatchError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOutcome:
    rows: tuple[dict[str, Any], ...]  # `RESULTS_SCHEMA` rows, in run order, floor last
    prompts: BenchPrompts | None  # None for the scoring workload (`score_session`)
    machine: MachineInfo


@dataclass
class _Peers:
    """What the peers hold across rounds: the hf-generate batch size, llama.cpp's context."""

    hf_batch: BatchSizeChoice
    llama_cpp: LlamaCppProcess | None = None  # in a process of its own (`llama_cpp_process`)


def run_bench(config: BenchConfig, progress: Progress) -> BenchOutcome:
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    threads = set_cpu_threads(config.threads)
    keep_freed_memory()
    progress(
        f"loading {config.model} ({config.dtype}, {config.device}, {describe_threads(threads)})"
    )
    loaded = load_model(
        config.model,
        device=config.device,
        dtype=config.dtype,
        revision=config.revision,
        trust_remote_code=config.trust_remote_code,
        tensor_parallel_size=config.tensor_parallel_size,
        tp_timeout=config.tp_timeout,
    )
    try:
        return _measure(loaded, config, progress, started_at)
    finally:
        loaded.close()  # the other tensor-parallel ranks, if any


def _measure(
    loaded: LoadedModel, config: BenchConfig, progress: Progress, started_at: str
) -> BenchOutcome:
    if config.workload == SCORING:
        machine = machine_info(next(loaded.model.parameters()).device)
        rows = measure_scoring(loaded, config, progress, started_at, machine)
        return BenchOutcome(rows=rows, prompts=None, machine=machine)
    prompts = load_prompts(config, loaded.tokenizer, loaded.name)
    machine = machine_info(next(loaded.model.parameters()).device)
    progress(
        f"workload {prompts.workload}: {prompts.num_prompts} prompts, {prompts.prompt_tokens:,} "
        f"prompt tokens (ideal prefill {prompts.ideal.unique_tokens:,}), "
        f"{prompts.max_tokens} new tokens each"
    )
    # The roofline's GEMM peak: the model's own linear shapes in its dtype at this thread
    # count (one process holds a tensor-parallel rank's shard only), measured at the start and
    # after every repeat; every run is priced at the highest measurement (`GemmPeak`).
    peak = GemmPeak(loaded.model) if config.tensor_parallel_size == 1 else None
    peers = _Peers(BatchSizeChoice(config.hf_generate_batch_size or WARMUP_PROMPTS))
    try:
        if peak is not None:
            peak.measure()
            progress(
                f"GEMM peak ({config.dtype}, {torch.get_num_threads()} threads): {peak.describe()}"
            )
        if LLAMA_CPP in config.peers:
            peers.llama_cpp = LlamaCppProcess(
                gguf_path(config.model), prompts, torch.get_num_threads()
            )
            progress(f"{LLAMA_CPP}: {peers.llama_cpp.path.name}, {peers.llama_cpp.config()}")
        if config.warmup:
            warmup = prompts.head(WARMUP_PROMPTS, WARMUP_MAX_TOKENS)
            systems = (*map(ours_system, config.kv_layouts), *config.peers)
            progress(f"warm-up: {', '.join(systems)}")
            list(_one_round(loaded, warmup, config, None, peers, None))  # timings dropped
        peers.hf_batch = _hf_batch_size(loaded, prompts, config, progress)
        measured: list[MeasuredRun] = []
        for repeat in range(config.repeat):
            best = None if peak is None else peak.best
            for measured_run in _one_round(loaded, prompts, config, repeat, peers, best):
                run = measured_run.run
                measured.append(measured_run)
                progress(
                    f"repeat {repeat + 1}/{config.repeat} {run.system}: {run.wall_seconds:.1f} "
                    f"s, {run.generated_tokens_per_second:.1f} generated tokens/s"
                    + _run_note(measured_run)
                )
            if peak is not None:
                peak.measure()
        if peak is not None:
            progress(f"GEMM peak: {peak.describe()}; every run's roofline is priced at it")
            measured = [_priced_at(m, peak.best) for m in measured]
    finally:
        if peers.llama_cpp is not None:
            peers.llama_cpp.close()
        if peak is not None:
            peak.close()
    if config.floor:
        progress("floor: timing the model forward alone")
        floor = measure_floor(loaded, prompts, config.engine.page_size, config.engine.numerics)
        measured.append(MeasuredRun(floor.as_run(prompts), load_average()))
        progress(f"floor: {floor.seconds:.1f} s")
    rows = tuple(
        result_row(m, started_at=started_at, config=config, prompts=prompts, machine=machine)
        for m in measured
    )
    return BenchOutcome(rows=rows, prompts=prompts, machine=machine)


def _hf_batch_size(
    loaded: LoadedModel, prompts: BenchPrompts, config: BenchConfig, progress: Progress
) -> BatchSizeChoice:
    if config.hf_generate_batch_size is not None or HF_GENERATE not in config.peers:
        return BatchSizeChoice(config.hf_generate_batch_size or HF_GENERATE_BATCH_SIZES[0])
    progress(f"{HF_GENERATE}: probing batch sizes")
    choice = choose_hf_batch_size(loaded, prompts)
    rates = ", ".join(f"{size}: {rate:,.1f}" for size, rate in (choice.probed or {}).items())
    progress(f"{HF_GENERATE}: batch size {choice.batch_size} (generated tokens/s {rates})")
    return choice


def _one_round(
    loaded: LoadedModel,
    prompts: BenchPrompts,
    config: BenchConfig,
    repeat: int | None,
    peers: _Peers,
    peak: float | None,
) -> Iterator[MeasuredRun]:
    """Ours in each KV layout, then each peer; yields each run as it ends. Our runs carry the
    roofline columns (with a measured `peak`); a peer that returns tokens, its greedy
    agreement with our first layout's tokens of the same round."""
    pool_pages = 0
    reference: SystemRun | None = None
    for layout in config.kv_layouts:
        load = load_average()
        ours = run_ours(loaded, prompts, replace(config.engine, kv_layout=layout), repeat)
        if ours.engine is None:
            raise AstraiBatchError("our engine's run carries no engine figures; this is a bug")
        pool_pages = ours.engine.kv_pool_pages  # the same KV memory in every layout
        reference = reference or ours
        extra = {}
        if peak is not None:
            line = roofline(loaded.model, ours, peak, prompts.num_prompts)
            extra = {
                "weight_gemm_flops": line.gemm_flops,
                "gemm_peak_flops_per_second": line.peak_flops_per_second,
            }
        yield MeasuredRun(ours, load, extra)
    for peer in config.peers:
        load = load_average()
        if peer == HF_GENERATE:
            run = run_hf_generate(loaded, prompts, peers.hf_batch, repeat)
        elif peer == HF_GENERATE_BATCH:
            run = run_hf_generate_batch(loaded, prompts, config.engine, pool_pages, repeat)
        elif peer == LLAMA_CPP and peers.llama_cpp is not None:
            run = peers.llama_cpp.run(prompts, repeat)
        else:
            raise AstraiBatchError(f"peer {peer} cannot run the generation workload; a bug")
        yield MeasuredRun(run, load, _agreement_columns(prompts, reference, run))


def _agreement_columns(
    prompts: BenchPrompts, ours: SystemRun | None, peer: SystemRun
) -> dict[str, float]:
    if ours is None or ours.token_ids is None or peer.token_ids is None:
        return {}
    figures = agreement(
        [list(ids) for ids in prompts.prompt_token_ids],
        [list(ids) for ids in ours.token_ids],
        [list(ids) for ids in peer.token_ids],
    )
    return {
        "greedy_agreement": figures["token_agreement"],
        "greedy_leading_agreement": figures["leading_agreement"],
    }


def _priced_at(measured: MeasuredRun, peak: float) -> MeasuredRun:
    """`measured` with its roofline's peak set to `peak` (a peer's run carries none)."""
    if "gemm_peak_flops_per_second" not in measured.extra:
        return measured
    return replace(measured, extra={**measured.extra, "gemm_peak_flops_per_second": peak})


def _run_note(measured: MeasuredRun) -> str:
    extra = measured.extra
    if "weight_gemm_flops" in extra:
        run = measured.run
        forward = run.engine.forward_seconds if run.engine is not None else None
        line = Roofline(
            extra["weight_gemm_flops"],
            extra["gemm_peak_flops_per_second"],
            run.wall_seconds,
            forward,
        )
        return f"; {line.line()}"
    if "greedy_agreement" in extra:
        return (
            f"; greedy agreement with ours {extra['greedy_agreement']:.1%} of tokens, "
            f"{extra['greedy_leading_agreement']:.1%} before each prompt's first difference"
        )
    return ""
