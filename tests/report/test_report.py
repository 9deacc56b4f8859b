"""`astrai-batch report`: the page of a finished job, checked as HTML (the browser test,
`test_report_browser`, opens it in Chromium): every plot an inline matplotlib <svg>, nothing
fetched from anywhere, the figures those of the output and its stats file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from jobs.jobkit import run_cli
from report.reportkit import (
    bench_files,
    external_references,
    finished_job,
    page_parts,
    summary_cells,
    svg_elements,
)

pytest.importorskip("matplotlib")

from astrai_batch.cli import main
from astrai_batch.jobs.output.timeline import TIMELINE_KEY
from astrai_batch.report.command import report_name
from astrai_batch.report.job_data import ErrorGroups, read_job


@pytest.fixture(scope="module")
def job(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("report")
    return {
        "output": finished_job(tiny_llama_dir, directory),
        "bench": bench_files(tiny_llama_dir, directory),  # type: ignore[dict-item]
    }


def test_the_page_holds_every_plot_inline_and_fetches_nothing(job) -> None:
    result = run_cli("report", job["output"], *(f"--bench={path}" for path in job["bench"]))
    assert result.exit_code == 0, result.output
    page_path = job["output"].with_name("out.report.html")
    assert result.stdout.strip() == str(page_path)
    page = page_path.read_text()
    parts = page_parts(page)
    svgs = svg_elements(page)
    # throughput, occupancy + KV, lengths, finish reasons, bench history
    assert len(svgs) == 5
    for svg in svgs:
        root = ET.fromstring(svg)  # each is well-formed SVG, drawn by matplotlib
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.get("viewBox")
        assert len(root.findall(".//{http://www.w3.org/2000/svg}path")) > 5
        assert '<g id="figure_1">' in svg and '<g id="axes_1">' in svg  # matplotlib's tree
    assert not {"script", "img", "link", "iframe", "object", "embed"} & set(parts.tags)
    assert external_references(page) == []
    assert page.startswith("<!DOCTYPE html>")


def test_the_numbers_are_the_output_s(job) -> None:
    run_cli("report", job["output"], "--out", job["output"].with_name("numbers.html"))
    page = job["output"].with_name("numbers.html").read_text()
    rows = pq.read_table(job["output"]).to_pylist()
    total = pq.read_table(job["output"].with_name("out.stats.parquet")).to_pylist()[-1]
    cells = summary_cells(page)
    failed = sum(1 for row in rows if row["finish_reason"] == "error")
    assert failed == 4  # two missing prompts, the repeat of id r3, one bad messages
    assert cells["rows"] == f"{len(rows):,}"
    assert cells["failed rows"] == f"{failed:,}"
    assert cells["generated tokens"] == f"{total['decode_tokens']:,}"
    assert cells["cache hit rate"] == f"{total['hit_rate']:.2%}"
    assert cells["device"] == "cpu" and cells["dtype"] == "float32"
    # the process's peak RSS: this test's job runs inside the suite's process, whose size varies
    assert re.fullmatch(r"\d[\d,.]* (KiB|MiB|GiB)", cells["peak memory (RSS)"])
    data = read_job(str(job["output"]))
    assert data.finish_reasons == Counter(row["finish_reason"] for row in rows)
    ran = [row for row in rows if row["finish_reason"] != "error"]
    assert sorted(data.completion_tokens.tolist()) == sorted(r["completion_tokens"] for r in ran)
    assert sorted(data.prompt_tokens.tolist()) == sorted(r["prompt_tokens"] for r in ran)
    # the repeated id's two rows form one group, with their count
    groups = {pattern: count for pattern, count, _ in data.errors.most_common(10)}
    assert sum(groups.values()) == failed
    assert groups["prompt is missing"] == 2
    for pattern, count in groups.items():
        assert f'<td class="num">{count:,}</td>' in page
        assert pattern.replace("'", "&#x27;") in page


def test_a_job_without_a_time_series_says_so(job, tmp_path) -> None:
    """An output written before jobs recorded one (or by Ray) still gets every other plot."""
    output = tmp_path / "old.parquet"
    output.write_bytes(job["output"].read_bytes())
    stats = pq.read_table(job["output"].with_name("out.stats.parquet"))
    metadata = {k: v for k, v in stats.schema.metadata.items() if k != TIMELINE_KEY.encode()}
    pq.write_table(stats.replace_schema_metadata(metadata), tmp_path / "old.stats.parquet")
    result = run_cli("report", output)
    assert result.exit_code == 0, result.output
    page = (tmp_path / "old.report.html").read_text()
    assert len(svg_elements(page)) == 2  # lengths, finish reasons
    assert page.count("Time series not recorded") == 2


def test_openai_jsonl_output(tiny_llama_dir, tmp_path) -> None:
    output = finished_job(tiny_llama_dir, tmp_path, "--output-format", "openai-jsonl")
    result = run_cli("report", output)
    assert result.exit_code == 0, result.output
    page = (tmp_path / "out.report.html").read_text()
    assert len(svg_elements(page)) == 4
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    data = read_job(str(output))
    assert data.failed_rows == sum(1 for line in lines if line["error"]) == 4
    completions = [
        line["response"]["body"]["usage"]["completion_tokens"] for line in lines if line["response"]
    ]
    assert sorted(data.completion_tokens.tolist()) == sorted(completions)


def test_parquet_dir_output(tiny_llama_dir, tmp_path) -> None:
    output = finished_job(tiny_llama_dir, tmp_path, "--output-format", "parquet-dir")
    assert output.is_dir()
    result = run_cli("report", output)
    assert result.exit_code == 0, result.output
    assert len(svg_elements((tmp_path / "parts.report.html").read_text())) == 4
    rows = pq.read_table(output).to_pylist()
    data = read_job(str(output))
    assert data.output_format == "parquet-dir"
    assert data.finish_reasons == Counter(row["finish_reason"] for row in rows)
    assert data.failed_rows == 4


def test_refusals_name_the_problem(tmp_path) -> None:
    def report(path: Path) -> Result:
        return CliRunner().invoke(main, ["report", str(path)])

    result = report(tmp_path / "missing.parquet")
    assert result.exit_code == 1
    assert f"Error: no output at {tmp_path / 'missing.parquet'}" in result.output
    (tmp_path / "lone.parquet").write_bytes(b"")
    result = report(tmp_path / "lone.parquet")
    assert result.exit_code == 1
    assert f"no stats file {tmp_path / 'lone.stats.parquet'} beside the output" in result.output


def test_report_names_and_error_groups() -> None:
    assert report_name("results.parquet") == "results.report.html"
    assert report_name("batch_output.jsonl") == "batch_output.report.html"
    assert report_name("parts") == "parts.report.html"
    groups = ErrorGroups()
    for message in (
        "row 'a': max_tokens must be >= 1, got 0",
        "row 'b': max_tokens must be >= 1, got -3",
        "prompt is missing",
    ):
        groups.add(message)
    assert groups.most_common(5) == [
        ("row '…': max_tokens must be >= N, got N", 2, "row 'a': max_tokens must be >= 1, got 0"),
        ("prompt is missing", 1, "prompt is missing"),
    ]
