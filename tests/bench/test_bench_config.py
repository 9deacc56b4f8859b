"""Bench options, validation messages and the small pieces the runs are built from."""

from __future__ import annotations

import pytest

from astrai_batch.bench.config import (
    BenchConfig,
    ours_system,
    parse_batch_size,
    parse_kv_layouts,
    parse_peers,
    parse_tolerance,
)
from astrai_batch.bench.results import RESULTS_COLUMNS, results_table
from astrai_batch.bench.rss import PeakRss
from astrai_batch.bench.runs import SystemRun, check_generated, percentile
from astrai_batch.engine import EngineConfig
from astrai_batch.errors import AstraiBatchError, ConfigError


@pytest.mark.parametrize(
    ("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), ("0", 0.0)]
)
def test_tolerance_accepts_percent_or_fraction(text: str, value: float) -> None:
    assert parse_tolerance(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots", "tolerance must be like 5% or 0.05, got 'lots'"),
        ("100%", "tolerance must be at least 0% and below 100%, got '100%'"),
        ("-1%", "tolerance must be at least 0% and below 100%, got '-1%'"),
    ],
)
def test_bad_tolerances_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_tolerance(text)
    assert str(error.value) == message


def test_peers_parse_from_a_comma_list() -> None:
    assert parse_peers("hf-generate, hf-generate-batch") == ("hf-generate", "hf-generate-batch")
    assert parse_peers("") == ()
    assert parse_peers("none") == ()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repeat": 0}, "repeat must be >= 1, got 0"),
        (
            {"peers": ("vllm",)},
            "peers: unknown peer 'vllm'; known peers: hf-generate, hf-generate-batch, "
            "llama-cpp, hf-score-pairs",
        ),
        (
            {"peers": ("hf-generate", "hf-generate")},
            "peers: hf-generate, hf-generate names a peer twice",
        ),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"seed": -1}, "seed must be a non-negative int, got -1"),
        ({"model": ""}, "model must be a non-empty string, got ''"),
        ({"warmup": "yes"}, "warmup must be a bool, got 'yes'"),
        (
            {"kv_layouts": ("ring",)},
            "kv layout: unknown layout 'ring'; known layouts: paged, contiguous",
        ),
        ({"kv_layouts": ("paged", "paged")}, "kv layout: paged, paged names a layout twice"),
        ({"kv_layouts": ()}, "kv_layouts must name at least one layout, got ()"),
        ({"hf_generate_batch_size": 0}, "hf_generate_batch_size must be >= 1, got 0"),
    ],
)
def test_config_names_the_bad_field(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        BenchConfig(**{"model": "m", **values})  # type: ignore[arg-type]
    assert str(error.value) == message


def test_kv_layouts_batch_sizes_and_system_names_parse() -> None:
    assert parse_kv_layouts("contiguous, paged") == ("contiguous", "paged")
    assert [ours_system(layout) for layout in ("paged", "contiguous")] == [
        "astrai",
        "astrai-contiguous",
    ]
    assert parse_batch_size("auto") is None
    assert parse_batch_size("48") == 48
    for text, message in (
        ("lots", "hf batch size must be auto or a positive int, got 'lots'"),
        ("0", "hf batch size must be >= 1, got 0"),
    ):
        with pytest.raises(ConfigError) as error:
            parse_batch_size(text)
        assert str(error.value) == message


def test_config_from_dict_builds_the_engine_config_and_rejects_unknown_keys() -> None:
    config = BenchConfig.from_dict(
        {
            "model": "m",
            "peers": ["hf-generate"],
            "kv_layouts": ["contiguous", "paged"],
            "engine": {"max_num_seqs": 8},
        }
    )
    assert config.peers == ("hf-generate",)
    assert config.kv_layouts == ("contiguous", "paged")
    assert config.hf_generate_batch_size is None
    assert config.engine == EngineConfig(max_num_seqs=8)
    with pytest.raises(ConfigError) as error:
        BenchConfig.from_dict({"model": "m", "repeats": 3})
    assert str(error.value) == "unknown bench option(s): repeats"


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.9) == pytest.approx(3.7)
    assert percentile(values, 0.0) == 1.0
    assert percentile([7.0], 0.9) == 7.0


def test_a_system_that_stops_early_fails_the_comparison() -> None:
    assert check_generated("hf-generate", [4, 4, 4], 4) == 12
    with pytest.raises(AstraiBatchError) as error:
        check_generated("hf-generate", [4, 2, 4, 1], 4)
    assert str(error.value) == (
        "hf-generate generated 2 tokens for prompt 1 instead of 4 (2 of 4 prompts differ); "
        "the comparison needs equal work"
    )


def test_rates_and_overhead_follow_from_a_run() -> None:
    run = SystemRun("hf-generate", 0, 2.0, 300, 100, None, "{}")
    assert (run.generated_tokens_per_second, run.total_tokens_per_second) == (50.0, 200.0)
    assert run.engine_overhead is None
    with pytest.raises(ValueError) as error:
        SystemRun("hf-generate", 0, 0.0, 300, 100, None, "{}")
    assert str(error.value) == "wall_seconds must be a positive number, got 0.0"


def test_results_table_fills_missing_columns_with_null_and_rejects_unknown_ones() -> None:
    table = results_table([{"system": "astrai", "repeat": 0}])
    assert tuple(table.column_names) == RESULTS_COLUMNS
    assert table.to_pylist()[0]["wall_seconds"] is None
    with pytest.raises(ValueError) as error:
        results_table([{"system": "astrai", "speed": 1.0}])
    assert str(error.value) == "results rows have columns outside the schema: speed"


def test_peak_rss_sees_memory_allocated_inside() -> None:
    with PeakRss(interval_seconds=0.001) as before:
        pass
    with PeakRss(interval_seconds=0.001) as rss:
        block = bytearray(64 * 1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])  # touch every page so it is resident
        del block
    assert rss.peak_bytes >= before.peak_bytes + 60 * 1024 * 1024
