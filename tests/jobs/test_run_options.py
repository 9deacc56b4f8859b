"""Exit status of a job whose every row failed, and the model options --max-model-len,
--revision, --trust-remote-code and --cuda-graphs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from jobs.jobkit import (
    engine_args,
    listing,
    read_rows,
    run_cli,
    start_process,
    summary_of,
    write_jsonl,
    write_parquet,
)

CUSTOM_CONFIG = """
from transformers import LlamaConfig


class CustomConfig(LlamaConfig):
    # A Llama clone under its own name, as many models with their own code are.

    model_type = "llama"

    def __init__(self, **kwargs):
        kwargs.pop("model_type", None)
        super().__init__(**kwargs)
        self.model_type = "llama"
"""
CUSTOM_MODEL = """
from transformers import LlamaForCausalLM

from .configuration_custom import CustomConfig


class CustomForCausalLM(LlamaForCausalLM):
    config_class = CustomConfig
"""


def token_rows(*lengths: int) -> list[dict]:
    return [
        {"id": f"r{i}", "prompt_token_ids": list(range(10, 10 + length))}
        for i, length in enumerate(lengths)
    ]


def test_a_job_whose_every_row_failed_exits_1_with_status_failed(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(10, 11, 12))
    output = tmp_path / "out.parquet"

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir), "--max-model-len", "12")

    assert result.exit_code == 1
    summary = summary_of(result.stdout)
    assert (summary["status"], summary["exit_code"], summary["failed_rows"]) == ("failed", 1, 3)
    message = (
        "all 3 rows failed; first error (row 0): prompt (10 tokens) + max_tokens (4) = 14 "
        "exceeds the model context of 12 tokens"
    )
    assert summary["message"] == message
    assert result.stderr == f"astrai-batch: {message}\n"
    # The output still says, row by row, why each failed.
    assert summary["output"] == str(output)
    assert [row["finish_reason"] for row in read_rows(output)] == ["error"] * 3
    config = json.loads(pq.read_schema(output).metadata[b"astrai_batch.config"])
    assert config["max_model_len"] == 12


def test_max_model_len_caps_the_context_and_some_rows_still_run(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(6, 10))
    output = tmp_path / "out.parquet"

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir), "--max-model-len", "12")

    assert result.exit_code == 0, result.stderr
    assert summary_of(result.stdout)["status"] == "completed_with_errors"
    short, long = read_rows(output)
    assert (short["finish_reason"], short["completion_tokens"]) == ("length", 4)
    assert long["error"] == (
        "prompt (10 tokens) + max_tokens (4) = 14 exceeds the model context of 12 tokens"
    )


def test_max_model_len_beyond_the_models_context_is_refused(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(3))
    result = run_cli(
        "run",
        source,
        tmp_path / "out.parquet",
        *engine_args(tiny_llama_dir),
        "--max-model-len",
        "5000",
    )
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: --max-model-len 5000 exceeds the context of model '{tiny_llama_dir}' "
        "(1024 tokens)\n"
    )
    assert listing(tmp_path) == ["in.jsonl"]


def test_an_input_without_rows_completes_with_an_empty_output(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    source = write_parquet(tmp_path / "in.parquet", {"prompt": pa.array([], pa.string())})
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert (summary["status"], summary["rows"], summary["failed_rows"]) == ("completed", 0, 0)
    assert read_rows(output) == []


def test_revision_is_for_hub_models(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(3))
    for command in (
        ["run", source, tmp_path / "out.parquet", *engine_args(tiny_llama_dir)],
        ["plan", source, "--model", tiny_llama_dir],
        ["bench", "--model", tiny_llama_dir, "--quiet"],
    ):
        result = run_cli(*command, "--revision", "v1")
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: --revision v1 applies to hub models only; '{tiny_llama_dir}' is a local "
            "directory\n"
        )
    assert listing(tmp_path) == ["in.jsonl"]


def test_a_model_with_its_own_code_needs_trust_remote_code(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    model = Path(shutil.copytree(tiny_llama_dir, tmp_path / "custom_model"))
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "astrai_custom_llama"  # unknown to transformers
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
    }
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration_custom.py").write_text(CUSTOM_CONFIG)
    (model / "modeling_custom.py").write_text(CUSTOM_MODEL)
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(5, 7))

    refused = run_cli("run", source, tmp_path / "out.parquet", *engine_args(model))
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: Model '{model}' needs code from its own files to load (config); pass "
        "--trust-remote-code to run it, if you trust its source\n"
    )

    # With the flag its code runs: the same weights give what the plain model gives.
    trusted = run_cli(
        "run", source, tmp_path / "out.parquet", *engine_args(model), "--trust-remote-code"
    )
    plain = run_cli("run", source, tmp_path / "plain.parquet", *engine_args(tiny_llama_dir))
    assert trusted.exit_code == plain.exit_code == 0, trusted.stderr
    completions = [row["completion"] for row in read_rows(tmp_path / "out.parquet")]
    assert completions == [row["completion"] for row in read_rows(tmp_path / "plain.parquet")]


def fake_hub_cache(cache: Path, repo: str, revisions: dict[str, Path]) -> None:
    """A Hugging Face hub cache holding `repo` at the given revisions (branch -> files), laid
    out as the hub client writes it, so an offline load reads it as a hub model."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    for number, (branch, files) in enumerate(sorted(revisions.items())):
        commit = f"{number + 1:040x}"
        (root / "refs" / branch).write_text(commit)
        shutil.copytree(files, root / "snapshots" / commit)


def test_revision_picks_a_hub_models_files(
    tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    cache = tmp_path / "hub"
    fake_hub_cache(cache, "astrai/tiny", {"main": tiny_llama_dir, "v2": tiny_qwen2_dir})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(5, 7))

    runs = {
        "main": ("astrai/tiny",),
        "v2": ("astrai/tiny", "--revision", "v2"),
        "llama": (tiny_llama_dir,),
        "qwen2": (tiny_qwen2_dir,),
    }
    # the four runs side by side (each mostly imports, on one core): a quarter of the wall
    processes = {
        name: start_process(
            "run", source, tmp_path / f"{name}.parquet", *engine_args(model), *extra
        )
        for name, (model, *extra) in runs.items()
    }
    completions = {}
    for name, process in processes.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        completions[name] = [row["completion"] for row in read_rows(tmp_path / f"{name}.parquet")]

    assert completions["main"] == completions["llama"]
    assert completions["v2"] == completions["qwen2"]
    assert completions["main"] != completions["v2"]
    metadata = pq.read_schema(tmp_path / "v2.parquet").metadata
    assert json.loads(metadata[b"astrai_batch.config"])["revision"] == "v2"
    model = json.loads(metadata[b"astrai_batch.model"])
    assert (model["name"], model["digest"][:6]) == ("astrai/tiny", "files:")


def test_cuda_graphs_on_a_cpu_is_a_usage_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", token_rows(3))
    args = ("run", source, tmp_path / "out.parquet", *engine_args(tiny_llama_dir))
    result = run_cli(*args, "--cuda-graphs")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: cuda_graphs needs device cuda, got device cpu"
    )
    assert listing(tmp_path) == ["in.jsonl"]
    assert run_cli(*args, "--no-cuda-graphs").exit_code == 0
