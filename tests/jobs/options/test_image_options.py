"""``--image-column``, ``--max-images-per-row`` and ``--max-image-pixels`` from the command
line into `JobConfig`: what the reader and `load_image` get, and the refusals."""

from __future__ import annotations

import pytest

from astrai_batch.cli import _explicit_options, run
from astrai_batch.errors import ConfigError
from astrai_batch.io.image_sources import ImageLimits
from astrai_batch.jobs.options.config import JobConfig


def config_of(*args: str) -> JobConfig:
    ctx = run.make_context("run", ["in.parquet", "out.parquet", "--device", "cpu", *args])
    params = {k: v for k, v in ctx.params.items() if k not in ("input_path", "output_path")}
    options, source = _explicit_options(ctx, params)
    return JobConfig.from_options(options, source=source)


def test_the_options_reach_the_reader_and_the_limits() -> None:
    config = config_of(
        "--image-column", "img", "--max-images-per-row", "3", "--max-image-pixels", "1000000"
    )
    assert config.input_options()["image_column"] == "img"
    assert config.input_options()["max_images_per_row"] == 3
    assert config.image_limits() == ImageLimits(max_pixels=1_000_000, max_images_per_row=3)
    # a resume must agree; limits at their defaults are left out, so a checkpoint from
    # before they existed resumes
    assert {
        name: config.result_options().get(name)
        for name in ("image_column", "max_images_per_row", "max_image_pixels")
    } == {"image_column": "img", "max_images_per_row": 3, "max_image_pixels": 1_000_000}
    assert {"max_images_per_row", "max_image_pixels"}.isdisjoint(JobConfig().result_options())
    defaults = config_of()
    assert defaults.image_column is None
    assert defaults.image_limits() == ImageLimits()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-images-per-row", "0"), "max_images_per_row must be >= 1, got 0"),
        (("--max-image-pixels", "-5"), "max_image_pixels must be >= 1, got -5"),
        (
            ("--image-column", "q", "--prompt-column", "q"),
            "--image-column and --prompt-column both name 'q'",
        ),
        (
            ("--image-column", "img", "--task", "score"),
            "--image-column runs with --task generate, not --task score",
        ),
    ],
)
def test_bad_image_options_are_refused(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_of(*args)
    assert str(error.value) == message


def test_a_toml_config_names_them_too() -> None:
    config = JobConfig.from_options({"image-column": "img", "max-image-pixels": 10})
    assert (config.image_column, config.max_image_pixels) == ("img", 10)
