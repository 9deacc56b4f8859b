"""The fast subset of the fault-injection soak (`scripts/soak` runs the rest): a few drawn
configurations, each killed at crash points and at random moments until it completes,
must write exactly what an uninterrupted run writes and leave nothing else behind. A
failure names its seed; ``scripts/soak --seed N`` reruns it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest
from jobs.faults.matrix import Matrix, draw
from jobs.faults.runner import Place, run_matrix

# Drawn once and kept because together they pass every crash point of a local run (crash
# points only: a timed kill may come after a fast job has finished, so it is the soak's),
# four input formats, the three output formats, both storages, both tasks beyond
# generation (5 embeds, 64 scores on S3) and adapters picked per row (3, by an OpenAI line's
# body.model); 69 (a Parquet image column) and 33 (a `datasets` save_to_disk directory of
# Arrow shards with bad and repeated rows, on S3) run images on a tiny LLaVA, undecodable
# ones among them.
LOCAL_SEEDS = (3, 5, 40, 64, 69, 33)
# Three workers on S3: killed after the stats file, resumed from its shards, then killed
# once the job is done (the rerun is refused as a finished job's)
RAY_SEED = 126


def place_for(matrix: Matrix, tmp_path: Path, s3_bucket) -> Place:
    if matrix.storage == "s3":
        return Place(s3_bucket.fs, f"bucket/fault-seed-{matrix.seed}", s3_bucket.query)
    (tmp_path / "job").mkdir()
    return Place(pafs.LocalFileSystem(), str(tmp_path / "job"))


@pytest.mark.parametrize("seed", LOCAL_SEEDS)
def test_a_drawn_local_configuration_survives_its_faults(
    seed: int, tiny_llama_dir: Path, tmp_path: Path, s3_bucket
) -> None:
    matrix = draw(seed, allow_ray=False)
    outcome = run_matrix(
        matrix, tiny_llama_dir, tmp_path, place_for(matrix, tmp_path, s3_bucket), None
    )

    assert outcome.mismatch is None, f"{outcome.line()}; reproduce: scripts/soak --seed {seed}"
    assert outcome.kills >= 1, outcome.line()


@pytest.mark.long  # Ray draws are soaked by scripts/soak; Ray kills also in test_ray_executor
def test_a_drawn_ray_configuration_survives_its_faults(
    tiny_llama_dir: Path, tmp_path: Path, s3_bucket, ray_address: str
) -> None:
    matrix = draw(RAY_SEED)
    assert matrix.uses_ray
    place = place_for(matrix, tmp_path, s3_bucket)

    outcome = run_matrix(matrix, tiny_llama_dir, tmp_path, place, ray_address)

    assert outcome.mismatch is None, f"{outcome.line()}; reproduce: scripts/soak --seed {RAY_SEED}"
    assert outcome.kills >= 1, outcome.line()


def test_the_draw_is_a_function_of_the_seed() -> None:
    assert [draw(seed) for seed in range(50)] == [draw(seed) for seed in range(50)]
    formats = {draw(seed).input_format for seed in range(50)}
    assert formats == {"parquet", "parquet-dir", "datasets-dir", "jsonl", "jsonl.gz", "openai"}


def test_images_are_drawn_only_for_plain_generation_on_either_executor() -> None:
    drawn = [draw(seed) for seed in range(200)]
    with_images = [m for m in drawn if m.kind.images]
    assert 15 <= len(with_images) <= 45  # 0.3 of generation without adapters
    assert {m.input_format for m in with_images} == {
        "parquet", "parquet-dir", "datasets-dir", "jsonl", "jsonl.gz", "openai"
    }  # fmt: skip
    assert {m.uses_ray for m in with_images} == {False, True}
    for m in with_images:
        assert m.kind.task == "generate" and not m.kind.adapters, m.describe()
