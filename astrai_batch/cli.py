"""The command line: a thin click layer over `jobs/`.

Exit codes of `run`: 0 success, 1 the job failed (or was aborted by --max-errors),
2 usage error, 3 finished with failed rows when --fail-on-row-errors is given, 130 / 143
interrupted by SIGINT / SIGTERM (rerun the same command to resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from astrai_batch import __version__
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.jobs.config import DEFAULT_MODEL, OUTPUT_FORMATS, JobConfig, load_toml_options

EXIT_INTERRUPTED_SIGINT = 130

_DEFAULTS = JobConfig()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="astrai-batch")
def main() -> None:
    """Offline batch inference for LLMs: prefix-grouped prompts, a radix KV cache,
    continuous batching, Parquet in and out."""


def _run_options(function: Any) -> Any:
    """The options of `run`, each named as its JobConfig / TOML key."""
    d = _DEFAULTS
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path),
            help="TOML file with any of these options (flags given here win).",
        ),
        # Model and engine.
        click.option(
            "--model",
            default=d.model,
            show_default=True,
            help="Model directory, .gguf file, alias or hub id.",
        ),
        click.option("--device", default=d.device, show_default=True),
        click.option(
            "--dtype",
            default=d.dtype,
            show_default=True,
            help="float32, bfloat16, float16 or auto.",
        ),
        click.option(
            "--max-num-seqs",
            type=int,
            default=d.max_num_seqs,
            show_default=True,
            help="Most sequences decoded together.",
        ),
        click.option(
            "--max-num-batched-tokens",
            type=int,
            default=d.max_num_batched_tokens,
            show_default=True,
            help="Token budget of one engine step.",
        ),
        click.option(
            "--kv-cache-memory",
            default=None,
            help="KV cache size, e.g. 2GiB or 512MiB (default 2GiB).",
        ),
        click.option(
            "--page-size",
            type=int,
            default=d.page_size,
            show_default=True,
            help="Tokens per KV page (the prefix-cache granularity).",
        ),
        click.option(
            "--prefix-cache/--no-prefix-cache",
            default=d.prefix_cache,
            show_default=True,
            help="Reuse the KV of shared prompt prefixes.",
        ),
        click.option(
            "--grouping/--no-grouping",
            default=d.grouping,
            show_default=True,
            help="Order rows in each window so shared prefixes run together.",
        ),
        click.option(
            "--group-window",
            type=int,
            default=d.group_window,
            show_default=True,
            help="Rows read, tokenized and ordered together.",
        ),
        # Input.
        click.option(
            "--input-format",
            type=click.Choice(["parquet", "jsonl"]),
            default=None,
            help="Override the format detected from the file name.",
        ),
        click.option("--prompt-column", default=None, help="Column holding the prompt."),
        click.option("--id-column", default=None, help="Column holding the row id."),
        click.option(
            "--keep-columns",
            default=None,
            help="Comma-separated input columns copied to the output.",
        ),
        # Sampling defaults (rows may override them).
        click.option("--max-tokens", type=int, default=d.sampling.max_tokens, show_default=True),
        click.option("--min-tokens", type=int, default=d.sampling.min_tokens, show_default=True),
        click.option(
            "--temperature",
            type=float,
            default=d.sampling.temperature,
            show_default=True,
            help="0 decodes greedily.",
        ),
        click.option("--top-p", type=float, default=d.sampling.top_p, show_default=True),
        click.option(
            "--top-k",
            type=int,
            default=d.sampling.top_k,
            show_default=True,
            help="0 disables top-k.",
        ),
        click.option("--min-p", type=float, default=d.sampling.min_p, show_default=True),
        click.option(
            "--repetition-penalty",
            type=float,
            default=d.sampling.repetition_penalty,
            show_default=True,
        ),
        click.option(
            "--presence-penalty", type=float, default=d.sampling.presence_penalty, show_default=True
        ),
        click.option(
            "--frequency-penalty",
            type=float,
            default=d.sampling.frequency_penalty,
            show_default=True,
        ),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option(
            "--n", type=int, default=d.sampling.n, show_default=True, help="Samples per prompt."
        ),
        click.option("--ignore-eos", is_flag=True, help="Generate past end-of-sequence tokens."),
        click.option(
            "--seed",
            type=int,
            default=d.seed,
            show_default=True,
            help="Job seed: sampled rows are reproducible for a given seed.",
        ),
        # Output.
        click.option(
            "--output-format",
            type=click.Choice(list(OUTPUT_FORMATS)),
            default=d.output_format,
            show_default=True,
        ),
        click.option("--save-tokens", is_flag=True, help="Add completion_token_ids."),
        click.option("--logprobs", is_flag=True, help="Add the logprob of each generated token."),
        click.option("--overwrite", is_flag=True, help="Replace an existing output."),
        click.option("--summary-json", default=None, help="Also write the JSON summary here."),
        # Reliability and operation.
        click.option("--restart", is_flag=True, help="Discard an existing checkpoint."),
        click.option(
            "--checkpoint-rows",
            type=int,
            default=d.checkpoint_rows,
            show_default=True,
            help="Save finished rows at least this often.",
        ),
        click.option(
            "--checkpoint-seconds",
            type=float,
            default=d.checkpoint_seconds,
            show_default=True,
            help="...and at least every this many seconds.",
        ),
        click.option(
            "--max-errors",
            default=None,
            help="Abort past this many failed rows: a count, 0.05 or 5%.",
        ),
        click.option(
            "--fail-on-row-errors", is_flag=True, help="Exit with 3 when some rows failed."
        ),
        click.option(
            "--progress-seconds",
            type=float,
            default=d.progress_seconds,
            show_default=True,
            help="Interval of progress lines when not a terminal.",
        ),
        click.option("--quiet", "-q", is_flag=True, help="No progress output."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.argument("output_path", metavar="OUTPUT", type=click.Path(path_type=Path))
@_run_options
@click.pass_context
def run(ctx: click.Context, input_path: Path, output_path: Path, **params: Any) -> None:
    """Generate a completion for every row of INPUT into the Parquet file OUTPUT.

    INPUT is a .parquet file, a directory of them, or a .jsonl / .jsonl.gz file, with
    prompt, messages, prompt_token_ids or OpenAI batch rows. Progress goes to stderr, a JSON
    summary to stdout. Rerunning an interrupted job resumes it.
    """
    from astrai_batch.jobs.runner import run_job
    from astrai_batch.jobs.summary import write_summary

    try:
        options, source = _explicit_options(ctx, params)
        config = JobConfig.from_options(options, source=source)
    except ConfigError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    if config.quiet:
        _silence_library_progress()
    try:
        summary = run_job(config, input_path, output_path)
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
    config_file = params.pop("config_file")
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
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
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
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--input-format", type=click.Choice(["parquet", "jsonl"]), default=None)
@click.option("--prompt-column", default=None)
@click.option("--id-column", default=None)
def plan(
    input_path: Path,
    model: str,
    page_size: int,
    top: int,
    as_json: bool,
    input_format: str | None,
    prompt_column: str | None,
    id_column: str | None,
) -> None:
    """Predict the prefix-cache saving on INPUT without running the model."""
    from astrai_batch.jobs.plan_report import plan_input

    try:
        report = plan_input(
            input_path,
            model=model,
            page_size=page_size,
            top=top,
            input_format=input_format,
            prompt_column=prompt_column,
            id_column=id_column,
        )
    except AstraiBatchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report.to_json() if as_json else report.text())


# Further commands (e.g. `bench`) live in their own modules and register here:
#     main.add_command(bench)


if __name__ == "__main__":
    main()
