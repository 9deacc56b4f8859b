"""The report opened in a real headless Chromium (Debian's `chromium`, driven by playwright):
it loads with no console error, asks for nothing beyond its own file, and shows its plots
drawn at a real size. Long suite (scripts/test-long installs the browser); skipped where the
browser or playwright is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs.jobkit import run_cli
from report.reportkit import bench_files, finished_job

pytestmark = pytest.mark.long

CHROMIUM = os.environ.get("ASTRAI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium; opened only once the jobs ran (playwright's sync API holds an
    event loop on this thread, and a job runs one of its own)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def test_the_page_loads_in_chromium_with_its_plots(tiny_llama_dir, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    output = finished_job(tiny_llama_dir, tmp_path)
    bench = bench_files(tiny_llama_dir, tmp_path)
    result = run_cli("report", output, *(f"--bench={path}" for path in bench))
    assert result.exit_code == 0, result.output
    with chromium() as browser:
        check_page(browser, tmp_path / "out.report.html", tmp_path / "report.png")


def check_page(browser: Any, page_path: Path, shot: Path) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    messages: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
    page.on("request", lambda request: requests.append(request.url))
    response = page.goto(page_path.as_uri(), wait_until="load")
    assert response is not None and response.ok

    assert [m for m in messages if m.startswith(("error", "pageerror"))] == []
    assert requests == [page_path.as_uri()]  # the page itself, nothing else
    boxes = page.eval_on_selector_all(
        "figure > svg",
        "svgs => svgs.map(s => { const r = s.getBoundingClientRect();"
        " return [r.width, r.height, s.querySelectorAll('path').length]; })",
    )
    assert len(boxes) == 5  # throughput, occupancy + KV, lengths, finish reasons, bench
    for width, height, paths in boxes:
        assert width > 250 and height > 100 and paths > 5
    headings = page.eval_on_selector_all("section h2", "hs => hs.map(h => h.textContent)")
    assert headings[:3] == ["Job", "Throughput over time", "Batch occupancy and KV use"]
    assert page.title().startswith("astrai-batch report")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000  # drawn, not blank
    page.close()
