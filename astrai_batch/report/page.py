"""The report as one self-contained HTML page: styles inline, plots inline `<svg>`, no script,
no font, image or link fetched from anywhere, so it opens the same offline, attached to a
mail, or from an object store."""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence
from typing import Any

from astrai_batch import __version__
from astrai_batch.report import plots
from astrai_batch.report.bench_history import BenchPoint
from astrai_batch.report.job_data import JobData

CSS = """
:root { --ink: #1f2933; --muted: #616e7c; --line: #e4e7eb; --bg: #f5f7fa; --card: #fff;
  --blue: #2f6fde; --red: #d64545; --teal: #14a38b; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background: #102a43; color: #fff; padding: 22px 32px 18px; }
header h1 { margin: 0 0 4px; font-size: 20px; font-weight: 600; }
header .sub { color: #bcccdc; font-size: 13px; word-break: break-all; }
.status { display: inline-block; margin-left: 10px; padding: 2px 10px; border-radius: 10px;
  font-size: 12px; font-weight: 600; vertical-align: 3px; }
.status.completed { background: #c6f7e2; color: #014d40; }
.status.errors { background: #ffe8d9; color: #841003; }
.status.failed { background: #ffe3e3; color: #610404; }
main { max-width: 1120px; margin: 0 auto; padding: 22px 24px 40px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(160px, 1fr)); gap: 12px;
  margin-bottom: 18px; }
.card { background: var(--card); border-radius: 8px; padding: 12px 16px;
  box-shadow: 0 1px 2px rgba(16, 42, 67, .08); }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .04em; }
.card .value { font-size: 24px; font-weight: 600; margin-top: 2px; }
.card .note { color: var(--muted); font-size: 12px; }
.card.bad .value { color: var(--red); }
.grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1.6fr); gap: 16px;
  align-items: start; }
section { background: var(--card); border-radius: 8px; padding: 14px 18px; margin-bottom: 16px;
  box-shadow: 0 1px 2px rgba(16, 42, 67, .08); }
section h2 { font-size: 15px; margin: 0 0 10px; }
figure { margin: 0; }
figure svg { width: 100%; height: auto; display: block; }
.empty { color: var(--muted); font-style: italic; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { color: var(--muted); font-weight: 500; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-word; }
.eg { color: var(--muted); font-size: 12px; margin-top: 2px; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 8px; }
@media (max-width: 860px) { .grid { grid-template-columns: 1fr; } }
"""


def render(job: JobData, bench: dict[tuple[str, str], list[BenchPoint]] | None) -> str:
    """The page for `job`, with the bench history when `bench` has series."""
    sections = [
        '<div class="grid">',
        _section("Job", _facts_table(job)),
        "<div>",
        _plot_section("Throughput over time", job, lambda t: plots.throughput_svg(t)),
        _plot_section("Batch occupancy and KV use", job, lambda t: plots.occupancy_svg(t)),
        "</div>",
        "</div>",
        _section(
            "Prompt and completion lengths",
            _figure(plots.lengths_svg(job.prompt_tokens, job.completion_tokens)),
        ),
        '<div class="grid">',
        _section("Finish reasons", _figure(plots.finish_reasons_svg(job.finish_reasons))),
        _section("Error reasons", _errors_table(job)),
        "</div>",
    ]
    if bench:
        title = "Bench history: throughput per invocation (median of its repeats)"
        sections.append(_section(title, _figure(plots.bench_history_svg(bench))))
    status_class = {"completed": "completed", "failed": "failed"}.get(job.status, "errors")
    model = job.model.get("name") or job.config.get("model") or "?"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>astrai-batch report: {_e(job.output)}</title>",
            f"<style>{CSS}</style></head><body>",
            "<header>",
            f'<h1>astrai-batch job report<span class="status {status_class}">'
            f"{_e(job.status)}</span></h1>",
            f'<div class="sub">{_e(job.output)} · {_e(model)}</div>',
            "</header><main>",
            _cards(job),
            *sections,
            f"<footer>Made by astrai-batch {_e(__version__)} on "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC from the "
            "output and its stats file.</footer>",
            "</main></body></html>",
        ]
    )


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _section(title: str, body: str) -> str:
    return f"<section><h2>{_e(title)}</h2>{body}</section>"


def _figure(svg: str) -> str:
    return f"<figure>{svg}</figure>"


def _plot_section(title: str, job: JobData, draw: Any) -> str:
    timeline = job.timeline
    if timeline is None or not timeline.points:
        why = (
            "not recorded: a Ray run's workers keep their own engines"
            if job.config.get("executor") == "ray"
            else "not recorded for this output (written by an astrai-batch without time series)"
        )
        return _section(title, f'<p class="empty">Time series {_e(why)}.</p>')
    return _section(title, _figure(draw(timeline)))


def _rate(job: JobData) -> float:
    return float(job.total.get("tokens_per_second") or 0.0)


def _cards(job: JobData) -> str:
    total = job.total
    failed = job.failed_rows
    share = failed / job.rows if job.rows else 0.0
    cards = [
        ("Rows", f"{job.rows:,}", f"{job.windows} window(s)", False),
        ("Failed rows", f"{failed:,}", f"{share:.1%} of rows", failed > 0),
        ("Tokens / s", f"{_rate(job):,.1f}", "generated", False),
        ("Cache hit rate", f"{float(total.get('hit_rate') or 0):.1%}", "prompt tokens", False),
        ("Wall", _duration(float(total.get("wall_seconds") or 0)), "running the rows", False),
    ]
    items = [
        f'<div class="card{" bad" if bad else ""}"><div class="label">{_e(label)}</div>'
        f'<div class="value">{_e(value)}</div><div class="note">{_e(note)}</div></div>'
        for label, value, note, bad in cards
    ]
    return f'<div class="cards">{"".join(items)}</div>'


def _facts_table(job: JobData) -> str:
    total, config, timeline = job.total, job.config, job.timeline
    peak_pages = int(total.get("peak_kv_pages") or 0)
    pool = f" of {timeline.kv_pages:,}" if timeline else ""
    rss = _bytes(timeline.peak_rss_bytes) if timeline and timeline.peak_rss_bytes else "—"
    numerics = "fast" if config.get("fast_numerics") else "batch-invariant"
    rows: Sequence[tuple[str, str]] = [
        ("model", str(job.model.get("name") or config.get("model") or "?")),
        ("architecture", str(job.model.get("architecture") or "—")),
        ("task", str(config.get("task") or "generate")),
        ("device", str(config.get("device") or "?")),
        ("dtype", str(config.get("dtype") or "?")),
        ("numerics", numerics),
        ("executor", str(config.get("executor") or "local")),
        ("output format", job.output_format),
        ("rows", f"{job.rows:,}"),
        ("failed rows", f"{job.failed_rows:,}"),
        ("prompt tokens", f"{int(total.get('prompt_tokens') or 0):,}"),
        ("cached prompt tokens", f"{int(total.get('cached_tokens') or 0):,}"),
        ("prefill computed", f"{int(total.get('prefill_tokens_computed') or 0):,}"),
        ("generated tokens", f"{int(total.get('decode_tokens') or 0):,}"),
        ("wall (running the rows)", _duration(float(total.get("wall_seconds") or 0))),
        ("tokens / s", f"{_rate(job):,.1f}"),
        ("cache hit rate", f"{float(total.get('hit_rate') or 0):.2%}"),
        ("peak memory (RSS)", rss),
        ("peak KV pages", f"{peak_pages:,}{pool}"),
        ("preemptions", f"{int(total.get('preemptions') or 0):,}"),
        ("evicted pages", f"{int(total.get('evicted_pages') or 0):,}"),
        ("astrai-batch", str(job.version or "?")),
    ]
    body = "".join(f"<tr><th>{_e(name)}</th><td>{_e(value)}</td></tr>" for name, value in rows)
    return f"<table>{body}</table>"


def _errors_table(job: JobData) -> str:
    groups = job.errors.most_common(25)
    if not groups:
        return '<p class="empty">No row failed.</p>'
    head = "<tr><th>rows</th><th>reason (values masked) and an example</th></tr>"
    body = "".join(
        f'<tr><td class="num">{count:,}</td><td><code>{_e(pattern)}</code>'
        + (f'<div class="eg">e.g. <code>{_e(example)}</code></div>' if example != pattern else "")
        + "</td></tr>"
        for pattern, count, example in groups
    )
    shown = sum(count for _, count, _ in groups)
    rest = sum(job.errors.counts.values()) + job.errors.other - shown
    more = f'<p class="empty">{rest:,} more rows in other reasons.</p>' if rest else ""
    return f"<table>{head}{body}</table>{more}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    return str(datetime.timedelta(seconds=round(seconds)))


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{count} B"
