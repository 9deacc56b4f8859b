"""`astrai-batch report OUTPUT`: the job's HTML page, written beside its output."""

from __future__ import annotations

import click

from astrai_batch.errors import AstraiBatchError, InputError, OutputError


def report_name(output_name: str) -> str:
    """results.parquet -> results.report.html (a parquet-dir or JSONL output alike)."""
    return output_name.removesuffix(".parquet").removesuffix(".jsonl") + ".report.html"


@click.command()
@click.argument("output_path", metavar="OUTPUT")
@click.option(
    "--bench",
    "bench_files",
    multiple=True,
    help="An `astrai-batch bench --out` results file (repeatable): adds the tokens/s history "
    "across them.",
)
@click.option(
    "--out",
    "report_path",
    default=None,
    help="Where to write the page [default: OUTPUT's name with .report.html, beside it].",
)
def report(output_path: str, bench_files: tuple[str, ...], report_path: str | None) -> None:
    """Write a self-contained HTML page about the finished job whose output is OUTPUT.

    It draws, from OUTPUT and its stats file: a summary table (model, device, dtype, rows,
    failed rows, tokens, wall time, tokens/s, cache hit rate, peak memory and KV pages),
    throughput over time, batch occupancy and KV cache use over time (the time series a
    local run records in the stats file), prompt and completion length histograms, the
    finish reasons and the error rows' reasons grouped; with --bench, the tokens/s of each
    workload and system across the result files. Plots are inline SVG (matplotlib, the
    `report` extra); the page fetches nothing. Prints the page's path.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            "the report needs matplotlib: pip install 'astrai-batch[report]'"
        ) from exc
    from astrai_batch.io.filesystems import AtomicObject, resolve
    from astrai_batch.report.bench_history import bench_history
    from astrai_batch.report.job_data import read_job
    from astrai_batch.report.page import render

    try:
        job = read_job(output_path)
        history = bench_history(list(bench_files)) if bench_files else None
        page = render(job, history)
        if report_path is not None:
            target = resolve(report_path, OutputError)
        else:
            output = resolve(output_path)
            target = output.sibling(report_name(output.name))
        commit = AtomicObject(target, overwrite=True)
        try:
            commit.handle.write(page.encode())
        except BaseException:
            commit.abort()
            raise
        commit.commit()
    except AstraiBatchError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(str(InputError(f"cannot write the report: {exc}"))) from exc
    click.echo(target.shown)
