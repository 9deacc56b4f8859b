"""Helpers of the report tests: a finished job with failed rows, real bench result files, and
what an HTML page holds (its plots, every address it names)."""

from __future__ import annotations

import datetime
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import torch
from jobs.jobkit import engine_args, run_cli, shared_prefix_prompts, write_jsonl

from astrai_batch.bench.results import read_results, write_results

ROWS = 60
BAD_ROWS = [
    {"id": "bad-a", "prompt": None},
    {"id": "bad-b", "prompt": None},
    {"id": "r3", "prompt": "a repeated id"},
    {"id": "bad-c", "messages": "not a list"},
]
# XML namespaces matplotlib's SVG declares: names, never fetched.
NAMESPACES = ("http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink")


def finished_job(model_dir: Path, directory: Path, *extra: str) -> Path:
    """A job of ROWS rows of varied lengths plus BAD_ROWS (4 failed rows: r3's repeat)."""
    rows = [
        {"id": f"r{i}", "prompt": prompt, "max_tokens": 2 + i % 9}
        for i, prompt in enumerate(shared_prefix_prompts(ROWS))
    ]
    source = write_jsonl(directory / "in.jsonl", rows + BAD_ROWS)
    names = {"openai-jsonl": "out.jsonl", "parquet-dir": "parts"}
    output = directory / next((names[f] for f in names if f in extra), "out.parquet")
    result = run_cli("run", source, output, *engine_args(model_dir), "--max-tokens", "9", *extra)
    assert result.exit_code == 0, result.output
    return output


def bench_files(model_dir: Path, directory: Path) -> list[Path]:
    """A real `bench` results file, and an earlier one: its rows a day older, 20% slower."""
    latest = directory / "bench-latest.parquet"
    threads = torch.get_num_threads()
    try:
        result = run_cli(
            "bench", "--model", model_dir, "--threads", "1", "--num-system-prompts", "2",
            "--questions-per-prompt", "2", "--system-prompt-words", "12", "--max-tokens", "3",
            "--kv-cache-memory", "8MiB", "--repeat", "2", "--no-warmup", "--no-floor",
            "--quiet", "--peers", "hf-generate", "--out", latest,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide
    assert result.exit_code == 0, result.output
    rows = read_results(latest)
    earlier = []
    for row in rows:
        when = datetime.datetime.fromisoformat(row["started_at"]) - datetime.timedelta(days=1)
        older = {**row, "started_at": when.isoformat()}
        older["generated_tokens_per_second"] = row["generated_tokens_per_second"] * 0.8
        earlier.append(older)
    first = directory / "bench-earlier.parquet"
    write_results(first, earlier)
    return [first, latest]


class PageParts(HTMLParser):
    """Tags, the addresses any attribute or style names, and the text of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.addresses: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if value is None:
                continue
            if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
                self.addresses.append(value)
            self.addresses += re.findall(r"url\(([^)]*)\)", value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        self.addresses += re.findall(r"url\(([^)]*)\)", data)


def page_parts(page: str) -> PageParts:
    parts = PageParts()
    parts.feed(page)
    return parts


def external_references(page: str) -> list[str]:
    """Every address the page could fetch, and any http(s) text outside XML namespaces."""
    parts = page_parts(page)
    fetched = [a for a in parts.addresses if not a.startswith("#")]
    text = page
    for namespace in NAMESPACES:
        text = text.replace(f'"{namespace}"', '""')
    return fetched + re.findall(r"(?:https?:)?//[\w.-]+\.\w+", text)


def svg_elements(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, flags=re.S)


def summary_cells(page: str) -> dict[str, Any]:
    """The job table: header text -> cell text."""
    return dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", page))
