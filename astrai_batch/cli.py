"""The command line: a thin click layer over `jobs/`.

Exit codes of `run`: 0 success, 1 the job failed (could not start, every row failed, or
aborted by --max-errors), 2 usage error, 3 finished with failed rows when
--fail-on-row-errors is given, 130 / 143 interrupted by SIGINT / SIGTERM (rerun the same
command to resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from astrai_batch import __version__
from astrai_batch.engine.attention.backends import ATTENTION_BACKENDS
from astrai_batch.engine.config import KV_LAYOUTS
from astrai_batch.engine.device_choice import AUTO, DEVICE_HELP, DTYPE_HELP
from astrai_batch.engine.embedding_types import POOLINGS
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.jobs.options.config import DEFAULT_MODEL, OUTPUT_FORMATS, JobConfig
from astrai_batch.jobs.options.config_file import load_toml_options
from astrai_batch.jobs.options.task_options import TASKS

EXIT_INTERRUPTED_SIGINT = 130

_DEFAULTS = JobConfig()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="astrai-batch")
def main() -> None:
    """Offline batch inference for LLMs: prefix-grouped prompts, a radix KV cache,
    continuous batching, Parquet in and out."""


def _option(flag: str, default: Any = None, help: str | None = None, **kwargs: Any) -> Any:
    """A click option that shows its default, when it has one."""
    shown = default is not None and not kwargs.get("is_flag")
    return click.option(flag, default=default, show_default=shown, help=help, **kwargs)


def _model_source_options() -> list[Any]:
    """Where a model's files come from: shared by `run` and `plan`."""
    return [
        _option("--revision", None, "Branch, tag or commit of a hub model."),
        _option(
            "--trust-remote-code",
            help="Allow a model's own Python code to run while it loads.",
            is_flag=True,
            default=False,
        ),
    ]


def _run_options(function: Any) -> Any:
    """The options of `run`, each named as its JobConfig / TOML key."""
    d, s = _DEFAULTS, _DEFAULTS.sampling
    flag: dict[str, Any] = {"is_flag": True, "default": False}
    path = click.Path(path_type=Path)
    options = [
        _option("--config", None, "TOML file of options (flags win).", type=path),
        # Model and engine.
        _option("--model", d.model, "Model directory, .gguf file, alias or hub id."),
        *_model_source_options(),
        _option("--device", AUTO, DEVICE_HELP),
        _option("--dtype", AUTO, DTYPE_HELP),
        _option(
            "--lora",
            None,
            "LoRA adapter NAME=PATH (a PEFT adapter directory or URI; repeatable); rows pick "
            "one by their lora field.",
            multiple=True,
        ),
        _option("--max-loras", d.max_loras, "Most LoRA adapters in a job.", type=int),
        _option("--max-lora-rank", d.max_lora_rank, "Largest LoRA rank accepted.", type=int),
        # Where the job runs.
        _option(
            "--executor",
            d.executor,
            "local: this process; ray: prefix-aware shards on a Ray cluster.",
            type=click.Choice(["local", "ray"]),
        ),
        _option("--ray-address", None, "Ray cluster to join (e.g. auto) [default: start one]."),
        _option("--workers", d.workers, "Engine workers (shards) with --executor ray.", type=int),
        _option("--worker-threads", d.worker_threads, "Torch threads per Ray worker.", type=int),
        _option("--worker-gpus", d.worker_gpus, "GPUs per Ray worker.", type=float),
        _option(
            "--tensor-parallel-size",
            d.tensor_parallel_size,
            "Split the model over this many ranks (GPUs with CUDA, processes on CPU).",
            type=int,
        ),
        _option(
            "--tp-timeout",
            d.tp_timeout,
            "Seconds a tensor-parallel rank may not answer before the job stops.",
            type=float,
        ),
        _option(
            "--threads",
            None,
            "CPU threads for torch [default: one per core]; fewer when other work shares them.",
            type=int,
        ),
        _option("--max-num-seqs", d.max_num_seqs, "Most sequences decoded together.", type=int),
        _option("--max-num-batched-tokens", d.max_num_batched_tokens, "Tokens per step.", type=int),
        _option(
            "--kv-cache-memory",
            None,
            "KV cache size, e.g. 2GiB or 512MiB [default: 30% of the available RAM on CPU, "
            "--gpu-memory-utilization on CUDA; less if the model needs less].",
        ),
        _option(
            "--gpu-memory-utilization",
            d.gpu_memory_utilization,
            "Share of the GPU's memory for weights, activations and the KV cache (CUDA).",
            type=float,
        ),
        _option("--page-size", d.page_size, "Tokens per KV page (prefix-cache unit).", type=int),
        _option("--prefix-cache/--no-prefix-cache", d.prefix_cache, "Reuse shared prefixes."),
        _option(
            "--fast-numerics",
            help="Step-shaped kernels: faster, but a row's output may depend on its batch "
            "(for jobs that neither sample nor resume; a checkpoint keeps its numerics).",
            **flag,
        ),
        _option(
            "--attention-backend",
            d.attention_backend,
            "sdpa: portable, batch-invariant; flashinfer, flash-attn: one paged CUDA kernel per "
            "layer (with --fast-numerics); auto: sdpa unless --fast-numerics on CUDA, then the "
            "first installed kernel.",
            type=click.Choice(list(ATTENTION_BACKENDS)),
        ),
        _option(
            "--cuda-graphs/--no-cuda-graphs",
            None,
            "Replay decode-only steps as CUDA graphs [default: on when the device is CUDA].",
        ),
        _option(
            "--kv-layout",
            d.kv_layout,
            "paged: pages on demand, prefix reuse; contiguous: one full-context seat per "
            "sequence, no prefix reuse.",
            type=click.Choice(list(KV_LAYOUTS)),
        ),
        _option(
            "--max-model-len",
            None,
            "Cap on prompt + output tokens [default: the model's context]; also the size of a "
            "contiguous seat.",
            type=int,
        ),
        _option("--grouping/--no-grouping", d.grouping, "Run shared prefixes together."),
        _option("--group-window", d.group_window, "Rows read and ordered together.", type=int),
        # Input.
        _option(
            "--input-format",
            None,
            "Overrides the format told by the file name.",
            type=click.Choice(["parquet", "jsonl"]),
        ),
        _option("--prompt-column", None, "Column holding the prompt."),
        _option("--id-column", None, "Column holding the row id."),
        _option("--keep-columns", None, "Comma-separated input columns copied to the output."),
        _option(
            "--chat-template-kwargs",
            None,
            """Chat template variables as a JSON object, e.g. '{"enable_thinking": false}'.""",
        ),
        # Sampling defaults; rows may override them.
        _option("--max-tokens", s.max_tokens, type=int),
        _option("--min-tokens", s.min_tokens, type=int),
        _option("--temperature", s.temperature, "0 decodes greedily.", type=float),
        _option("--top-p", s.top_p, type=float),
        _option("--top-k", s.top_k, "0 disables top-k.", type=int),
        _option("--min-p", s.min_p, type=float),
        _option("--repetition-penalty", s.repetition_penalty, type=float),
        _option("--presence-penalty", s.presence_penalty, type=float),
        _option("--frequency-penalty", s.frequency_penalty, type=float),
        _option("--stop", None, "Stop string (repeatable).", multiple=True),
        _option("--n", s.n, "Samples per prompt.", type=int),
        _option("--ignore-eos", help="Generate past end-of-sequence tokens.", **flag),
        # The job-wide output constraint (one of them); a row's own constraint replaces it.
        _option("--json-schema", None, "Outputs are JSON valid under this schema file."),
        _option("--regex", None, "Outputs fully match this regular expression."),
        _option("--choice", None, "Outputs are exactly one of these comma-separated strings."),
        _option("--grammar", None, "Outputs follow this EBNF grammar file (rule root)."),
        _option("--seed", d.seed, "Job seed: sampled rows reproduce for a given seed.", type=int),
        _option("--task", d.task, "generate, score or embed.", type=click.Choice(TASKS)),
        _option("--pooling", None, "embed: last, mean or cls.", type=click.Choice(POOLINGS)),
        click.option(
            "--normalize/--no-normalize", default=True, help="embed: unit L2 norm (default on)."
        ),
        _option("--dimensions", None, "embed: keep the first N values.", type=int),
        # Output.
        _option("--output-format", d.output_format, type=click.Choice(list(OUTPUT_FORMATS))),
        _option("--save-tokens", help="Add completion_token_ids.", **flag),
        _option("--logprobs", help="Add the logprob of each generated token.", **flag),
        _option("--top-logprobs", s.top_logprobs, "Per token its N likeliest (0-20).", type=int),
        _option("--prompt-logprobs", None, "Per prompt token its logprob, N likeliest.", type=int),
        _option("--overwrite", help="Replace an existing output.", **flag),
        _option("--summary-json", None, "Also write the JSON summary to this file."),
        # Reliability and operation.
        _option("--restart", help="Discard an existing checkpoint and start over.", **flag),
        _option("--checkpoint-rows", d.checkpoint_rows, "Save finished rows this often", type=int),
        _option("--checkpoint-seconds", d.checkpoint_seconds, "...and this often.", type=float),
        _option("--max-errors", None, "Abort past this many failed rows: 10, 0.05 or 5%."),
        _option("--fail-on-row-errors", help="Exit with 3 when some rows failed.", **flag),
        _option(
            "--progress-seconds", d.progress_seconds, "Progress line interval (no TTY).", type=float
        ),
        click.option("--quiet", "-q", is_flag=True, default=False, help="No progress output."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@main.command()
@click.argument("input_path", metavar="INPUT")
@click.argument("output_path", metavar="OUTPUT")
@_run_options
@click.pass_context
def run(ctx: click.Context, input_path: str, output_path: str, **params: Any) -> None:
    """Generate a completion for every row of INPUT into the Parquet file OUTPUT.

    INPUT is a .parquet file, a directory of them, or a .jsonl / .jsonl.gz file, with
    prompt, messages, prompt_token_ids or OpenAI batch rows. INPUT and OUTPUT may be local
    paths or URIs (s3://, gs://, hdfs://, file://). Progress goes to stderr, a JSON
    summary to stdout. Rerunning an interrupted job resumes it.
    """
    from astrai_batch.jobs.run import run_with_executor
    from astrai_batch.jobs.summary import write_summary

    try:
        options, source = _explicit_options(ctx, params)
        config = JobConfig.from_options(options, source=source)
    except ConfigError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    if config.quiet:
        _silence_library_progress()
    try:
        summary = run_with_executor(config, input_path, output_path)
        click.echo(summary.to_json())
        if config.summary_json:
            write_summary(config.summary_json, summary)
    except AstraiBatchError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        click.echo("astrai-batch: interrupted", err=True)
        ctx.exit(EXIT_INTERRUPTED_SIGINT)
    if summary.status == "aborted":
        raise click.ClickException(summary.message or "the job was aborted")
    if summary.message:
        click.echo(f"astrai-batch: {summary.message}", err=True)
    ctx.exit(summary.exit_code)


def _silence_library_progress() -> None:
    """--quiet: transformers draws its own bar while loading weights."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _explicit_options(ctx: click.Context, params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """TOML options from --config, overridden by the flags given on the command line."""
    config_file = params.pop("config")
    options: dict[str, Any] = {}
    source = "the command line"
    if config_file is not None:
        options = load_toml_options(config_file)
        source = str(config_file)
    for name, value in params.items():
        if ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None):
            continue
        options[name.replace("-", "_")] = list(value) if isinstance(value, tuple) else value
    # Re-key so TOML spellings with dashes and flag names meet in one namespace.
    return {key.replace("-", "_"): value for key, value in options.items()}, source


@main.command()
@click.argument("input_path", metavar="INPUT")
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Model whose tokenizer is used (no weights are loaded).",
)
@click.option("--page-size", type=int, default=_DEFAULTS.page_size, show_default=True)
@click.option(
    "--top",
    type=int,
    default=10,
    show_default=True,
    help="How many of the largest shared prefixes to list.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Also predict the hit rate on this many workers: prefix-aware shards vs input order.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--input-format", type=click.Choice(["parquet", "jsonl"]), default=None)
@click.option("--prompt-column", default=None)
@click.option("--id-column", default=None)
@_model_source_options()[0]
@_model_source_options()[1]
@click.option("--chat-template-kwargs", default=None, help="As for run: a JSON object.")
@_option(
    "--task", _DEFAULTS.task, "As for run: generate, score or embed.", type=click.Choice(TASKS)
)
@_option("--pooling", None, "embed: last, mean or cls.", type=click.Choice(POOLINGS))
@_option("--dimensions", None, "embed: as for run (checks OpenAI lines).", type=int)
@click.pass_context
def plan(
    ctx: click.Context,
    input_path: str,
    model: str,
    revision: str | None,
    trust_remote_code: bool,
    page_size: int,
    top: int,
    workers: int | None,
    as_json: bool,
    input_format: str | None,
    prompt_column: str | None,
    id_column: str | None,
    chat_template_kwargs: str | None,
    task: str,
    pooling: str | None,
    dimensions: int | None,
) -> None:
    """Predict the prefix-cache saving on INPUT (a path or a URI) without running the
    model."""
    from astrai_batch.jobs.options.option_values import parse_json_object
    from astrai_batch.jobs.plan_report import plan_input

    try:
        kwargs = None
        if chat_template_kwargs is not None:
            kwargs = parse_json_object(chat_template_kwargs, "chat_template_kwargs")
    except ConfigError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    try:
        report = plan_input(
            input_path,
            model=model,
            revision=revision,
            trust_remote_code=trust_remote_code,
            page_size=page_size,
            top=top,
            input_format=input_format,
            prompt_column=prompt_column,
            id_column=id_column,
            workers=workers,
            chat_template_kwargs=kwargs,
            task=task,
            pooling=pooling,
            dimensions=dimensions,
        )
    except AstraiBatchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report.to_json() if as_json else report.text())


# Further commands live in their own modules and register here.
from astrai_batch.bench.command import bench  # noqa: E402

main.add_command(bench)


if __name__ == "__main__":
    main()
