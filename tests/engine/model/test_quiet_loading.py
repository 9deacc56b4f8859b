"""Logs hold our own progress lines only: no third-party progress bars when stderr is not a
terminal (transformers' "Loading weights", shard and GGUF bars, huggingface_hub's)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine.gguf_writer import write_tiny_llama_gguf
from huggingface_hub import utils as hub_utils
from transformers.utils import logging as transformers_logging

from astrai_batch.engine.model.library_progress import library_progress_off

REPO_ROOT = Path(__file__).resolve().parents[3]
BAR_TEXT = ("Loading weights", "Writing model shards", "de-quantizing", "it/s", "%|")


def run_logged(
    tmp_path: Path, model: str, cache: Path
) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    """`astrai-batch run` as a child whose stderr is a pipe, as under cron or a scheduler."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": "The quick brown fox"}) + "\n")
    output = tmp_path / "out.parquet"
    env = {
        **os.environ,
        "ASTRAI_BATCH_CACHE": str(cache),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        env.pop(name, None)  # the bars must be off because of us, not of the environment
    args = ["run", str(source), str(output), "--model", model, "--max-tokens", "3"]
    done = subprocess.run(
        [sys.executable, "-m", "astrai_batch.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,  # bytes: text mode would turn the bars' "\r" into newlines
        timeout=600,
    )
    return done, output


def assert_own_lines_only(raw: bytes) -> None:
    stderr = raw.decode("utf-8")
    assert "\r" not in stderr
    for text in BAR_TEXT:
        assert text not in stderr, stderr
    lines = stderr.splitlines()
    assert lines and all(line.startswith("astrai-batch: ") for line in lines), stderr


def test_a_directory_load_writes_no_third_party_bars(tiny_llama_dir, tmp_path):
    done, output = run_logged(tmp_path, str(tiny_llama_dir), tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert output.is_file()
    assert_own_lines_only(done.stderr)


def test_a_first_gguf_load_converts_without_bars(tiny_llama_dir, tmp_path):
    gguf_file = write_tiny_llama_gguf(Path(tiny_llama_dir), tmp_path / "tiny.F32.gguf")
    cache = tmp_path / "cache"
    done, _ = run_logged(tmp_path, str(gguf_file), cache)
    assert done.returncode == 0, done.stderr
    assert len(list((cache / "gguf").iterdir())) == 2  # converted in this run (+ hash index)
    assert_own_lines_only(done.stderr)


@pytest.mark.slow
@pytest.mark.long  # a tiny GGUF's first load is checked the same way in the suite
def test_the_default_model_converts_without_bars(tmp_path):
    # The real first run: SmolLM2's GGUF converted into an empty cache (about 45 s).
    done, _ = run_logged(tmp_path, "smollm2-135m", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert_own_lines_only(done.stderr)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def bars_on():
    """Bars on, as in a fresh process (an in-process `--quiet` run switches them off)."""
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()
    yield
    if not was_on:
        transformers_logging.disable_progress_bar()


def test_the_switch_is_scoped_and_leaves_terminals_alone(bars_on):
    assert not hub_utils.are_progress_bars_disabled()
    with library_progress_off(io.StringIO()):
        assert not transformers_logging.is_progress_bar_enabled()
        assert hub_utils.are_progress_bars_disabled()
    assert transformers_logging.is_progress_bar_enabled()
    assert not hub_utils.are_progress_bars_disabled()
    with library_progress_off(_Terminal()):
        assert transformers_logging.is_progress_bar_enabled()
    hub_utils.disable_progress_bars()  # a caller's own choice is kept
    try:
        with library_progress_off(io.StringIO()):
            pass
        assert hub_utils.are_progress_bars_disabled()
    finally:
        hub_utils.enable_progress_bars()
