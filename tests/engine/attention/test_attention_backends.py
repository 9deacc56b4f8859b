"""Choosing the attention backend: what `auto` picks, and every refusal's exact line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from astrai_batch.engine.attention.backends import (
    ATTENTION_BACKENDS,
    import_kernel_module,
    resolve_attention_backend,
    resolve_from_options,
)
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.option_groups import RESULT_OPTIONS


def installed(*names: str):
    return lambda module: module in names


def resolve(requested, *, device="cuda", numerics="fast", page=16, dtype=torch.bfloat16, have=()):
    return resolve_attention_backend(
        requested,
        device=device,
        numerics=numerics,
        page_size=page,
        dtype=dtype,
        importable=installed(*have),
    )


BOTH = ("flashinfer", "flash_attn")


def test_auto_is_sdpa_under_invariant_numerics_whatever_is_installed():
    assert resolve("auto", numerics="invariant", have=BOTH) == "sdpa"
    assert resolve("auto", device="cpu", numerics="invariant", have=BOTH) == "sdpa"


def test_auto_is_sdpa_off_cuda():
    assert resolve("auto", device="cpu", have=BOTH) == "sdpa"
    assert resolve("auto", device=torch.device("cpu"), have=BOTH) == "sdpa"


def test_auto_prefers_flashinfer_then_flash_attn_under_fast_numerics_on_cuda():
    assert resolve("auto", have=BOTH) == "flashinfer"
    assert resolve("auto", device="cuda:1", have=("flash_attn",), page=256) == "flash-attn"
    assert resolve("auto", device=torch.device("cuda", 0), have=()) == "sdpa"


def test_auto_skips_a_kernel_that_cannot_run_with_these_settings():
    assert resolve("auto", have=("flash_attn",), page=16) == "sdpa"  # FA2 pages: 256k
    assert resolve("auto", have=BOTH, dtype=torch.float32) == "sdpa"
    assert resolve("auto", have=("flashinfer",), dtype="float16") == "flashinfer"


def test_sdpa_runs_anywhere():
    for device in ("cpu", "cuda", "mps"):
        for numerics in ("invariant", "fast"):
            assert resolve("sdpa", device=device, numerics=numerics, dtype="float32") == "sdpa"


@pytest.mark.parametrize(
    ("requested", "options", "message"),
    [
        (
            "flashinfer",
            {"device": "cpu"},
            "--attention-backend flashinfer needs a CUDA device",
        ),
        (
            "flash-attn",
            {"device": torch.device("cpu"), "numerics": "invariant"},
            "--attention-backend flash-attn needs a CUDA device",
        ),
        (
            "flashinfer",
            {"numerics": "invariant", "have": BOTH},
            "--attention-backend flashinfer does not keep batch-invariant numerics; "
            "add --fast-numerics or use --attention-backend sdpa",
        ),
        (
            "flashinfer",
            {"have": ("flash_attn",)},
            "--attention-backend flashinfer needs FlashInfer: "
            "pip install 'astrai-batch[flashinfer]'",
        ),
        (
            "flash-attn",
            {"have": ("flashinfer",), "page": 256},
            "--attention-backend flash-attn needs flash-attn: "
            "pip install 'astrai-batch[flash-attn]'",
        ),
        (
            "flash-attn",
            {"have": BOTH, "page": 16},
            "--attention-backend flash-attn needs --page-size a multiple of 256, got 16",
        ),
        (
            "flashinfer",
            {"have": BOTH, "dtype": torch.float32},
            "--attention-backend flashinfer needs --dtype bfloat16 or float16, got float32",
        ),
    ],
)
def test_refusals(requested, options, message):
    with pytest.raises(ConfigError) as caught:
        resolve(requested, **options)
    assert str(caught.value) == message


def test_explicit_kernels_accepted_where_they_run():
    assert resolve("flashinfer", have=BOTH, page=1) == "flashinfer"
    assert resolve("flash-attn", have=BOTH, page=512, dtype="float16") == "flash-attn"


def test_unknown_names_refused_by_every_config():
    message = "attention_backend must be one of auto, sdpa, flashinfer, flash-attn, got 'xformers'"
    for build in (
        lambda: EngineConfig(attention_backend="xformers"),
        lambda: JobConfig(attention_backend="xformers"),
        lambda: resolve("xformers"),
    ):
        with pytest.raises(ConfigError) as caught:
            build()
        assert str(caught.value) == message
    assert EngineConfig.from_dict({"attention_backend": "sdpa"}).attention_backend == "sdpa"
    assert ATTENTION_BACKENDS == ("auto", "sdpa", "flashinfer", "flash-attn")


def test_option_values_resolve_dtype_auto_by_device():
    # dtype auto is bfloat16 on CUDA: a kernel is acceptable there, float32 is not
    assert (
        resolve_from_options("sdpa", device="cuda", dtype="auto", numerics="fast", page_size=16)
        == "sdpa"
    )
    with pytest.raises(ConfigError, match=r"got float32$"):
        resolve_attention_backend(
            "flashinfer",
            device="cuda",
            numerics="fast",
            page_size=16,
            dtype="float32",
            importable=installed(*BOTH),
        )


def test_job_option_is_a_result_option_passed_to_the_engine():
    assert "attention_backend" in RESULT_OPTIONS
    config = JobConfig.from_options({"attention-backend": "sdpa", "fast-numerics": True})
    assert config.engine_options()["attention_backend"] == "sdpa"
    assert config.result_options()["attention_backend"] == "sdpa"
    assert JobConfig().resolved_attention_backend() == "sdpa"


def test_engine_records_the_resolved_backend(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir)
    core = EngineCore(loaded, EngineConfig(num_pages=8, numerics="fast"))
    assert core.attention_backend == "sdpa"
    assert core.runner.attention_kernel is None
    with pytest.raises(ConfigError, match=r"^--attention-backend flash-attn needs a CUDA device$"):
        EngineCore(loaded, EngineConfig(num_pages=8, attention_backend="flash-attn"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "astrai_batch.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_run_refuses_before_loading_the_model(tmp_path):
    # the model does not exist: the refusal must come first, before any load is tried
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    result = _cli(
        "run",
        str(tmp_path / "in.jsonl"),
        str(tmp_path / "out.parquet"),
        "--model",
        str(tmp_path / "no-such-model"),
        "--attention-backend",
        "flashinfer",
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: --attention-backend flashinfer needs a CUDA device"
    )


def test_summary_names_the_resolved_backend(tmp_path, tiny_llama_dir):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"prompt": "def f(x): return"}) + "\n")
    result = _cli(
        "run",
        str(source),
        str(tmp_path / "out.parquet"),
        "--model",
        str(tiny_llama_dir),
        "--max-tokens",
        "2",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["attention_backend"] == "sdpa"


def test_bench_refuses_before_loading_the_model():
    result = _cli("bench", "--model", "no-such-model", "--attention-backend", "flash-attn")
    assert result.returncode == 2, result.stderr
    assert "--attention-backend flash-attn needs a CUDA device" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="installed")
def test_a_kernel_that_does_not_import_is_refused_in_one_line():
    with pytest.raises(ConfigError) as caught:
        import_kernel_module("flashinfer")
    assert str(caught.value) == (
        "--attention-backend flashinfer: FlashInfer does not import (No module named 'flashinfer')"
    )
