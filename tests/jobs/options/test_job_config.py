"""Job options: parsing, validation with exact messages, TOML files, option values."""

from __future__ import annotations

from pathlib import Path

import pytest

from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import DEFAULT_MODEL, JobConfig
from astrai_batch.jobs.options.config_file import load_toml_options
from astrai_batch.jobs.options.option_groups import PLANNING_OPTIONS, RESULT_OPTIONS, RUN_OPTIONS
from astrai_batch.jobs.options.option_values import ErrorLimit, parse_columns, parse_size
from astrai_batch.jobs.planning.prefix_order import PlanningOptions


def test_defaults() -> None:
    config = JobConfig()
    assert config.model == DEFAULT_MODEL == "smollm2-135m"
    assert config.sampling == SamplingParams(max_tokens=256)
    assert (config.group_window, config.page_size, config.output_format) == (
        100_000,
        16,
        None,  # from OUTPUT's name
    )
    assert config.max_errors is None and config.kv_cache_memory is None


def test_from_options_routes_sampling_and_parses_strings() -> None:
    config = JobConfig.from_options(
        {
            "max-tokens": 8,
            "temperature": 0.7,
            "stop": ["\n", "END"],
            "logprobs": True,
            "kv_cache_memory": "512MiB",
            "max_errors": "5%",
            "keep_columns": "a, b,,c",
            "page_size": 32,
        }
    )
    assert config.sampling == SamplingParams(
        max_tokens=8, temperature=0.7, stop=("\n", "END"), logprobs=True
    )
    assert config.kv_cache_memory == 512 * 1024**2
    assert config.max_errors == ErrorLimit(fraction=0.05)
    assert config.keep_columns == ("a", "b", "c")
    assert config.page_size == 32
    assert config.engine_options() == {
        "page_size": 32,
        "kv_cache_memory": 512 * 1024**2,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 1024,
        "enable_prefix_cache": True,
        "kv_layout": "paged",
        "max_model_len": None,
        "seed": 0,
        "numerics": "invariant",
        "attention_backend": "auto",
        "cuda_graphs": None,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bogus": 1, "max_tokenz": 2}, "unknown option(s) in the test: bogus, max_tokenz"),
        ({"page_size": "16"}, "page_size must be an integer, got string"),
        ({"page_size": 0}, "page_size must be >= 1, got 0"),
        ({"threads": 0}, "threads must be >= 1, got 0"),
        ({"threads": "2"}, "threads must be an integer, got string"),
        ({"grouping": "yes"}, "grouping must be a boolean, got string"),
        ({"model": 3}, "model must be a string, got integer"),
        ({"model": " "}, "model must not be empty"),
        (
            {"output_format": "csv"},
            "output_format must be parquet, openai-jsonl or parquet-dir, got 'csv'",
        ),
        ({"input_format": "csv"}, "input_format must be parquet or jsonl, got 'csv'"),
        ({"checkpoint_seconds": 0}, "checkpoint_seconds must be a number of seconds > 0, got 0"),
        ({"seed": -1}, "seed must be a non-negative integer, got -1"),
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0"),
        ({"keep_columns": 3}, "keep_columns must be a comma-separated string or a list, got 3"),
        ({"cuda_graphs": "on"}, "cuda_graphs must be a boolean, got string"),
        ({"cuda_graphs": True}, "cuda_graphs needs device cuda, got device cpu"),
        ({"cuda_graphs": True, "device": "mps"}, "cuda_graphs needs device cuda, got device mps"),
        (
            {"cuda_graphs": True, "device": "cuda", "attention_backend": "flashinfer"},
            "cuda_graphs cannot be used with attention_backend flashinfer (its step metadata "
            "is planned on the host every step); use sdpa or turn cuda_graphs off",
        ),
    ],
)
def test_invalid_options_name_the_field(options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        JobConfig.from_options(options, source="the test")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1048576", 1_048_576),
        (" 64 kib ", 65_536),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "2 GiBs", "-1", "", "0", 0, True, 1.5])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ConfigError, match=r"^kv_cache_memory must be"):
        parse_size(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "limit", "allowed"),
    [
        ("10", ErrorLimit(count=10), 10),
        (10, ErrorLimit(count=10), 10),
        ("0", ErrorLimit(count=0), 0),
        ("0.05", ErrorLimit(fraction=0.05), 10),
        (0.05, ErrorLimit(fraction=0.05), 10),
        ("5%", ErrorLimit(fraction=0.05), 10),
        ("100%", ErrorLimit(fraction=1.0), 200),
        ("0.333", ErrorLimit(fraction=0.333), 66),
    ],
)
def test_error_limit(value: str | float, limit: ErrorLimit, allowed: int) -> None:
    parsed = ErrorLimit.parse(value)
    assert parsed == limit
    assert parsed.allowed(200) == allowed


def test_error_limit_rejects() -> None:
    for value, message in [
        ("many", "max_errors must be a count, a fraction or a percentage, got 'many'"),
        ("150%", "max_errors as a fraction must be in [0, 1], got 1.5"),
        ("1.5", "max_errors as a fraction must be in [0, 1], got 1.5"),
        (-3, "max_errors must be a count >= 0, got -3"),
        ("nan", "max_errors must be a count, a fraction or a percentage, got 'nan'"),
    ]:
        with pytest.raises(ConfigError) as caught:
            ErrorLimit.parse(value)
        assert str(caught.value) == message
    assert ErrorLimit(count=3).describe() == "3"
    assert ErrorLimit(fraction=0.05).describe() == "5%"


def test_result_options_leave_out_operational_settings() -> None:
    base = JobConfig.from_options({"max_tokens": 4})
    operational = JobConfig.from_options(
        {
            "max_tokens": 4,
            "threads": 1,
            "output_format": "openai-jsonl",
            "save_tokens": True,
            "overwrite": True,
            "restart": True,
            "max_errors": 3,
            "fail_on_row_errors": True,
            "checkpoint_rows": 7,
            "checkpoint_seconds": 9,
            "progress_seconds": 1,
            "quiet": True,
            "summary_json": "s.json",
            # Budgets change which rows run together, never a row's result.
            "kv_cache_memory": "64MiB",
            "max_num_seqs": 3,
            "max_num_batched_tokens": 99,
            "prefix_cache": False,
            "trust_remote_code": True,
            "model": "/elsewhere/same-model",
            "device": "cpu:0",
        }
    )
    assert operational.result_options() == base.result_options()
    assert JobConfig.from_options({"max_tokens": 5}).result_options() != base.result_options()
    assert base.to_dict()["max_tokens"] == 4 and base.to_dict()["stop"] == []
    changes = (
        {"seed": 3},
        {"revision": "v2"},
        {"max_model_len": 64},
        {"dtype": "bf16"},
        {"attention_backend": "sdpa"},  # a kernel sums in another order
    )
    for changed in changes:
        options = JobConfig.from_options({"max_tokens": 4, **changed}).result_options()
        assert options != base.result_options(), changed
    assert base.result_options()["device"] == "cpu"


def test_every_option_is_classified_once() -> None:
    """A new option must say whether it can change results (RESULT_OPTIONS), how the job
    is planned (PLANNING_OPTIONS) or neither (RUN_OPTIONS)."""
    classified = [*RESULT_OPTIONS, *PLANNING_OPTIONS, *RUN_OPTIONS]
    assert len(classified) == len(set(classified))
    assert set(classified) == set(JobConfig().to_dict())


def test_planning_options() -> None:
    config = JobConfig.from_options({"page_size": 8, "grouping": False, "group_window": 5})
    assert config.planning_options() == PlanningOptions(8, False, 5)
    assert config.planning_options().describe() == ("page size 8, grouping off, group window 5")


def test_toml_options(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('model = "m"\nmax-tokens = 12\nstop = ["a", "b"]\n')
    options = load_toml_options(path)
    assert options == {"model": "m", "max-tokens": 12, "stop": ["a", "b"]}
    config = JobConfig.from_options(options, source=str(path))
    assert (config.model, config.sampling.max_tokens, config.sampling.stop) == ("m", 12, ("a", "b"))


def test_toml_problems(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as caught:
        load_toml_options(missing)
    assert str(caught.value) == f"config file not found: {missing}"

    nested = tmp_path / "nested.toml"
    nested.write_text("[engine]\npage_size = 8\n")
    with pytest.raises(ConfigError) as caught:
        load_toml_options(nested)
    assert str(caught.value) == (
        f"config file {nested} must hold top-level options only, found table(s): engine"
    )

    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n")
    with pytest.raises(ConfigError) as caught:
        load_toml_options(broken)
    assert str(caught.value).startswith(f"config file {broken} is not valid TOML: ")


def test_parse_columns() -> None:
    assert parse_columns(["x", "y"]) == ("x", "y")
    assert parse_columns("x") == ("x",)
    assert parse_columns("") == ()
