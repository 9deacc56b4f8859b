"""The command line: a thin click layer over `jobs/`.

Exit codes of `run`: 0 success, 1 the job failed (could not start, every row failed, or
aborted by --max-errors), 2 usage error, 3 finished with failed rows when
--fail-on-row-errors is given, 130 / 143 interrupted by SIGINT / SIGTERM (rerun the same
command to resume).
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from astrai_batch import __version__
from astrai_batch.cli_options import JOB_DEFAULTS, model_source_options, option, run_options
from astrai_batch.engine.tasks.embedding_types import POOLINGS
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.jobs.options.config import DEFAULT_MODEL, JobConfig
from astrai_batch.jobs.options.config_file import load_toml_options
from astrai_batch.jobs.options.task_options import TASKS

EXIT_INTERRUPTED_SIGINT = 130


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="astrai-batch")
def main() -> None:
    """Offline batch inference for LLMs: prefix-grouped prompts, a radix KV cache,
    continuous batching, Parquet in and out."""


@main.command()
@click.argument("input_path", metavar="INPUT")
@click.argument("output_path", metavar="OUTPUT")
@run_options
@click.pass_context
def run(ctx: click.Context, input_path: str, output_path: str, **params: Any) -> None:
    """Generate a completion for every row of INPUT into OUTPUT: Parquet for a .parquet
    name, OpenAI batch output lines for .jsonl, a directory of Parquet parts for a directory
    (or --output-format).

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
@click.option("--page-size", type=int, default=JOB_DEFAULTS.page_size, show_default=True)
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
@model_source_options()[0]
@model_source_options()[1]
@click.option("--chat-template-kwargs", default=None, help="As for run: a JSON object.")
@option(
    "--task", JOB_DEFAULTS.task, "As for run: generate, score or embed.", type=click.Choice(TASKS)
)
@option(
    "--pooling",
    None,
    "embed: the pooling (default: the model's sentence-transformers one, else last).",
    type=click.Choice(POOLINGS),
)
@option("--dimensions", None, "embed: as for run (checks OpenAI lines).", type=int)
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
from astrai_batch.report.command import report  # noqa: E402

main.add_command(bench)
main.add_command(report)


if __name__ == "__main__":
    main()
