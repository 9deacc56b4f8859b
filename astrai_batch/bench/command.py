"""`astrai-batch bench`: throughput of the engine (and its peers) on a workload, gated.

Exit codes: 0 done (and, with --baseline, every tracked figure compared and held), 1 the
benchmark failed, 2 usage error (also: results not comparable with --baseline), 4
(`EXIT_REGRESSION`) a tracked figure regressed past --tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from astrai_batch.bench.config import (
    DEFAULT_TOLERANCE,
    HF_GENERATE_BATCH_SIZES,
    PEER_NAMES,
    SCORING,
    BenchConfig,
    parse_batch_size,
    parse_kv_layouts,
    parse_peers,
    parse_tolerance,
)
from astrai_batch.bench.workloads import WORKLOAD_NAMES
from astrai_batch.engine.attention.backends import ATTENTION_BACKENDS, resolve_from_options
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.device_choice import (
    AUTO,
    DEVICE_HELP,
    DTYPE_HELP,
    device_kind,
    resolve_device_name,
)
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.jobs.options.config import DEFAULT_MODEL
from astrai_batch.jobs.options.option_values import parse_size

_ENGINE = EngineConfig()


@click.command()
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Model to benchmark.")
@click.option("--revision", default=None, help="Branch, tag or commit of a hub model.")
@click.option(
    "--trust-remote-code",
    is_flag=True,
    help="Allow a model's own Python code to run while it loads.",
)
@click.option("--device", default=AUTO, show_default=True, help=DEVICE_HELP)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="CPU threads for torch [default: one per core]; fewer when other work shares them.",
)
@click.option(
    "--dtype",
    default=AUTO,
    show_default=True,
    help=DTYPE_HELP,
)
@click.option(
    "--workload",
    default="shared-prefix",
    show_default=True,
    help=f"A built-in workload ({', '.join((*WORKLOAD_NAMES, SCORING))}) or an input file "
    "`run` accepts.",
)
@click.option("--repeat", type=int, default=3, show_default=True, help="Measured runs per system.")
@click.option(
    "--peers",
    default="",
    help=f"Comma-separated peers run alternately with ours: {', '.join(PEER_NAMES)}.",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Write the results Parquet here."
)
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    default=None,
    help="An earlier results file; exit 4 when a tracked figure regressed, 2 when the two "
    "results are not comparable.",
)
@click.option(
    "--tolerance",
    default=f"{DEFAULT_TOLERANCE:.0%}",
    show_default=True,
    help="Allowed regression against --baseline, e.g. 5% or 0.05.",
)
@click.option(
    "--max-tokens", type=int, default=None, help="New tokens per prompt [workload preset; 64]."
)
@click.option("--num-system-prompts", type=int, default=None, help="Workload size: S.")
@click.option("--questions-per-prompt", type=int, default=None, help="Workload size: U.")
@click.option(
    "--system-prompt-words",
    type=int,
    default=None,
    help="Workload size: words (scoring: tokens of a few-shot context).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Workload seed.")
@click.option("--max-num-seqs", type=int, default=_ENGINE.max_num_seqs, show_default=True)
@click.option(
    "--max-num-batched-tokens", type=int, default=_ENGINE.max_num_batched_tokens, show_default=True
)
@click.option("--page-size", type=int, default=_ENGINE.page_size, show_default=True)
@click.option(
    "--kv-cache-memory",
    default=None,
    help="KV cache size, e.g. 2GiB [default: 30% of the available RAM on CPU; on CUDA see "
    "--gpu-memory-utilization].",
)
@click.option(
    "--gpu-memory-utilization",
    type=float,
    default=_ENGINE.gpu_memory_utilization,
    show_default=True,
    help="Share of the GPU's memory for weights, activations and the KV cache (CUDA).",
)
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True)
@click.option(
    "--tensor-parallel-size",
    type=int,
    default=1,
    show_default=True,
    help="Our engine over this many ranks (needs --peers none --no-floor).",
)
@click.option(
    "--tp-timeout", type=float, default=120.0, show_default=True, help="Seconds a rank may hang."
)
@click.option(
    "--fast-numerics",
    is_flag=True,
    help="Our engine with step-shaped kernels instead of batch-invariant numerics.",
)
@click.option(
    "--attention-backend",
    type=click.Choice(list(ATTENTION_BACKENDS)),
    default=_ENGINE.attention_backend,
    show_default=True,
    help="sdpa, flashinfer or flash-attn (CUDA kernels, with --fast-numerics); auto: sdpa "
    "unless --fast-numerics on CUDA, then the first installed kernel.",
)
@click.option(
    "--cuda-graphs/--no-cuda-graphs",
    default=None,
    help="Replay our decode-only steps as CUDA graphs [default: on with --device cuda].",
)
@click.option(
    "--kv-layout",
    default="paged",
    show_default=True,
    help="KV layouts our engine runs in, comma-separated (paged, contiguous); each runs "
    "every repeat, in the same KV memory.",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="Cap on prompt + output tokens [model's context]; a contiguous seat's size.",
)
@click.option(
    "--hf-batch-size",
    default="auto",
    show_default=True,
    help="Batch size of the hf-generate peer; auto: the fastest of "
    f"{', '.join(map(str, HF_GENERATE_BATCH_SIZES))} on a short probe.",
)
@click.option(
    "--from-results",
    type=click.Path(path_type=Path),
    default=None,
    help="Report (and gate with --baseline) an earlier results file instead of running.",
)
@click.option("--no-warmup", is_flag=True, help="Skip the warm-up run.")
@click.option("--no-floor", is_flag=True, help="Skip timing the model-forward floor.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@click.pass_context
def bench(ctx: click.Context, **options: Any) -> None:
    """Measure throughput on a workload; a table on stderr, a JSON summary on stdout.

    Our engine (greedy, end-of-sequence ignored, so every system generates exactly
    --max-tokens per prompt) runs --repeat times after a warm-up, alternating with each of
    --peers. With --baseline: exit 4 when a tracked figure regressed past --tolerance, 2 when
    the results are not comparable (other work, model, dtype, device kind or KV layouts).
    """
    from astrai_batch.bench.baseline import compare_to_baseline
    from astrai_batch.bench.report import summary_json, summary_table
    from astrai_batch.bench.results import read_results, write_results
    from astrai_batch.bench.session import run_bench
    from astrai_batch.bench.summary import summarize

    quiet = options.pop("quiet")
    if quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # its weight-loading bar
    baseline_path = options.pop("baseline")
    out_path = options.pop("out")
    from_results = options.pop("from_results")
    if from_results is not None and out_path is not None:
        raise click.UsageError("--out does not apply with --from-results (nothing runs)", ctx)
    try:
        tolerance = parse_tolerance(options.pop("tolerance"))
        config = _config(options)
    except ConfigError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    try:
        baseline = summarize(read_results(baseline_path)) if baseline_path else None
        if from_results is not None:
            rows = read_results(from_results)
        else:
            rows = list(run_bench(config, _progress(quiet)).rows)
            if out_path is not None:
                write_results(out_path, rows)
        summary = summarize(rows)
    except AstraiBatchError as exc:
        raise click.ClickException(str(exc)) from exc
    comparison = compare_to_baseline(summary, baseline, tolerance) if baseline else None
    click.echo(summary_table(summary), err=True)
    if comparison is not None:
        for line in comparison.lines():
            click.echo(line, err=True)
    click.echo(summary_json(summary, comparison))
    if comparison is not None and comparison.not_comparable:
        raise click.UsageError(comparison.reason(), ctx)
    ctx.exit(comparison.exit_code if comparison is not None else 0)


def _config(options: dict[str, Any]) -> BenchConfig:
    memory = options.pop("kv_cache_memory")
    engine = EngineConfig(
        page_size=options.pop("page_size"),
        max_num_seqs=options.pop("max_num_seqs"),
        max_num_batched_tokens=options.pop("max_num_batched_tokens"),
        kv_cache_memory=parse_size(memory) if memory is not None else None,
        enable_prefix_cache=options.pop("prefix_cache"),
        numerics="fast" if options.pop("fast_numerics") else "invariant",
        gpu_memory_utilization=options.pop("gpu_memory_utilization"),
        max_model_len=options.pop("max_model_len"),
        attention_backend=options.pop("attention_backend"),
        cuda_graphs=options.pop("cuda_graphs"),
    )
    device = resolve_device_name(options.pop("device"))
    if engine.cuda_graphs and device_kind(device) != "cuda":
        raise ConfigError(f"--cuda-graphs needs --device cuda, got --device {device}")
    config = BenchConfig(
        model=options.pop("model"),
        device=device,
        dtype=options.pop("dtype"),
        revision=options.pop("revision"),
        trust_remote_code=options.pop("trust_remote_code"),
        threads=options.pop("threads"),
        workload=options.pop("workload"),
        repeat=options.pop("repeat"),
        peers=parse_peers(options.pop("peers")),
        max_tokens=options.pop("max_tokens"),
        num_system_prompts=options.pop("num_system_prompts"),
        questions_per_prompt=options.pop("questions_per_prompt"),
        system_prompt_words=options.pop("system_prompt_words"),
        seed=options.pop("seed"),
        engine=engine,
        hf_generate_batch_size=parse_batch_size(options.pop("hf_batch_size")),
        kv_layouts=parse_kv_layouts(options.pop("kv_layout")),
        warmup=not options.pop("no_warmup"),
        floor=not options.pop("no_floor"),
        tensor_parallel_size=options.pop("tensor_parallel_size"),
        tp_timeout=options.pop("tp_timeout"),
    )
    _check_attention(config)
    return config


def _check_attention(config: BenchConfig) -> None:
    """Refuses an attention backend that cannot run here before any model loads."""
    resolve_from_options(
        config.engine.attention_backend,
        device=config.device,
        dtype=config.dtype,
        numerics=config.engine.numerics,
        page_size=config.engine.page_size,
    )


def _progress(quiet: bool) -> Callable[[str], None]:
    def report(message: str) -> None:
        if not quiet:
            click.echo(f"bench: {message}", err=True)

    return report
