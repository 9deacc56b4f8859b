"""Parquet `--image-column` jobs end to end through the CLI on a tiny LLaVA: binary cells, Hugging
Face `{bytes, path}` struct cells (one with null bytes, read from its path), a list of two
images and a broken image. Each good row's tokens equal transformers `generate` on the
processor's own output; the broken row is its one-line error, the job exits as for row errors
(0 by default) and the stats count one vision-tower run per distinct image."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import run_cli
from vision_kit import hf_vlm_greedy, processed, random_image, save_tiny_llava

MAX_TOKENS = 5
BROKEN = b"\x89PNG but not really"


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    return save_tiny_llava(tmp_path_factory.mktemp("llava"))


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def run_job(llava_dir: Path, source: Path, output: Path):
    return run_cli(
        "run", source, output, "--model", llava_dir, "--image-column", "img",
        "--max-tokens", MAX_TOKENS, "--kv-cache-memory", "8MiB", "--save-tokens", "--quiet",
    )  # fmt: skip


def check_rows(llava_dir: Path, output: Path, good: dict[str, tuple[str, list]]) -> dict:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(llava_dir)
    got = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    names = sorted(good)
    inputs = [processed(processor, *good[name]) for name in names]
    expected = hf_vlm_greedy(llava_dir, inputs, MAX_TOKENS)
    for name, want, batch in zip(names, expected, inputs, strict=True):
        assert got[name]["finish_reason"] in ("stop", "length"), got[name]["error"]
        assert got[name]["completion_token_ids"] == want, name
        assert got[name]["prompt_tokens"] == batch["input_ids"].shape[1], name
    return got


def test_struct_and_list_cells_run_exactly_and_a_broken_cell_fails_its_row(llava_dir, tmp_path):
    one, two, three = random_image(31), random_image(32, (48, 36)), random_image(33, (30, 30))
    on_disk = tmp_path / "three.png"
    three.save(on_disk)
    cell = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pair = [{"bytes": png(one), "path": None}, {"bytes": png(two), "path": None}]
    rows = [
        ("struct", "What is shown?", [{"bytes": png(one), "path": "one.png"}]),
        ("path", "Describe it.", [{"bytes": None, "path": str(on_disk)}]),
        ("pair", "Compare them.", pair),
        ("broken", "What is shown?", [{"bytes": BROKEN, "path": "bad.png"}]),
        ("none", "Just text.", []),
    ]  # fmt: skip
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "prompt": [r[1] for r in rows],
            "img": pa.array([r[2] for r in rows], type=pa.list_(cell)),
        }
    )
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, source)
    result = run_job(llava_dir, source, output)
    assert result.exit_code == 0, result.stderr  # row errors do not fail the job by default
    good = {
        "struct": ("What is shown?", [one]),
        "path": ("Describe it.", [three]),
        "pair": ("Compare them.", [one, two]),
        "none": ("Just text.", []),
    }
    got = check_rows(llava_dir, output, good)
    assert got["broken"]["finish_reason"] == "error"
    assert got["broken"]["error"] == (
        "image bad.png (19 bytes) is not an image Pillow can decode (unknown or corrupt header)"
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["failed_rows"] == 1
    assert summary["images_encoded"] == 3  # one, two, three: `one` twice, encoded once
    stats = pq.read_table(tmp_path / "out.stats.parquet").to_pylist()
    assert stats[-1]["is_total"] and stats[-1]["images_encoded"] == 3


def test_binary_and_path_string_cells(llava_dir, tmp_path):
    one, two = random_image(41), random_image(42, (36, 44))
    two.save(tmp_path / "two.png")
    binary = {"id": ["a", "b", "bad"], "prompt": ["Q1?", "Q2?", "Q3?"]}
    binary["img"] = pa.array([png(one), png(two), BROKEN], type=pa.binary())
    strings = {"id": ["p"], "prompt": ["Where?"], "img": [str(tmp_path / "two.png")]}
    for name, columns in (("binary", binary), ("string", strings)):
        source, output = tmp_path / f"{name}.parquet", tmp_path / f"{name}.out.parquet"
        pq.write_table(pa.table(columns), source)
        result = run_job(llava_dir, source, output)
        assert result.exit_code == 0, result.stderr
        if name == "binary":
            got = check_rows(llava_dir, output, {"a": ("Q1?", [one]), "b": ("Q2?", [two])})
            assert got["bad"]["error"] == (
                f"image ({len(BROKEN)} bytes) is not an image Pillow can decode (unknown or "
                "corrupt header)"
            )
            assert json.loads(result.stdout.strip().splitlines()[-1])["images_encoded"] == 2
        else:
            check_rows(llava_dir, output, {"p": ("Where?", [two])})


def test_image_limits_reach_the_vision_model(llava_dir, tmp_path):
    """--max-image-pixels and --max-images-per-row fail their rows on a vision model (the
    local executor's encoder takes the job's limits: the first load and the engine's reload)."""
    small, big = random_image(51, (20, 20)), random_image(52, (40, 50))
    pair = [{"bytes": png(small), "path": None}, {"bytes": png(small), "path": None}]
    cell = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "id": ["small", "big", "pair"],
            "prompt": ["Q?", "Q?", "Q?"],
            "img": pa.array(
                [[{"bytes": png(small), "path": "small.png"}],
                 [{"bytes": png(big), "path": "big.png"}], pair],
                type=pa.list_(cell),
            ),
        }
    )  # fmt: skip
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, source)
    result = run_cli(
        "run", source, output, "--model", llava_dir, "--image-column", "img",
        "--max-tokens", MAX_TOKENS, "--kv-cache-memory", "8MiB", "--save-tokens", "--quiet",
        "--max-image-pixels", 1000, "--max-images-per-row", 1,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    got = check_rows(llava_dir, output, {"small": ("Q?", [small])})
    assert got["big"]["error"] == (
        f"image big.png ({len(png(big)):,} bytes) has more pixels (40x50 = 2,000) than "
        "--max-image-pixels 1,000"
    )
    assert got["pair"]["error"] == "the row has 2 images, more than --max-images-per-row 1"
