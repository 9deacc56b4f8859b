"""Jobs with LoRA adapters: rows pick one by `lora` (or an OpenAI line by body.model), each
adapter's rows equal transformers + PEFT, a mixed job equals the per-adapter jobs, pages are
never shared across adapters, bad adapters are refused before anything is written."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import read_rows, run_cli, stop_after_parts, summary_of, write_jsonl
from lora_kit import ATTENTION, make_adapter, peft_greedy

from astrai_batch.io.filesystems import resolve
from astrai_batch.jobs.output.checkpoint import checkpoint_dir_for

MAX_NEW = 6
NAMES = [None, "r4", "r16", "attn"]


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("job-adapters")
    return {
        "r4": make_adapter(tiny_llama_dir, root / "r4", rank=4, seed=1),
        "r16": make_adapter(tiny_llama_dir, root / "r16", rank=16, seed=2),
        "attn": make_adapter(tiny_llama_dir, root / "attn", rank=8, seed=3, targets=ATTENTION),
    }


def lora_args(adapters) -> list[str]:
    return [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]


def run_args(model_dir, source, output, adapters, *extra) -> list:
    return [
        "run",
        source,
        output,
        "--model",
        model_dir,
        "--max-tokens",
        MAX_NEW,
        "--kv-cache-memory",
        "8MiB",
        "--quiet",
        "--save-tokens",
        "--logprobs",
        *lora_args(adapters),
        *extra,
    ]


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(3, 380) for _ in range(20)]
    return [
        shared + [rng.randrange(3, 380) for _ in range(rng.randint(2, 30))] for _ in range(count)
    ]


def test_rows_equal_peft_and_keep_their_adapter(tiny_llama_dir, adapters, tmp_path):
    rows = prompts(12)
    lines = [
        {"id": f"r{i}", "prompt_token_ids": p, "lora": NAMES[i % 4]} for i, p in enumerate(rows)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    result = run_cli(*run_args(tiny_llama_dir, source, output, adapters))
    assert result.exit_code == 0, result.output
    got = read_rows(output)
    assert [row["lora"] for row in got] == [NAMES[i % 4] for i in range(12)]
    for name in NAMES:
        which = [i for i in range(12) if NAMES[i % 4] == name]
        path = None if name is None else adapters[name]
        want = peft_greedy(tiny_llama_dir, path, [rows[i] for i in which], MAX_NEW)
        assert [got[i]["completion_token_ids"] for i in which] == want, name
    expected = [
        {
            "adapter": name,
            "rows": 3,
            "failed_rows": 0,
            **{
                key: sum(got[i][key] for i in range(12) if NAMES[i % 4] == name)
                for key in ("prompt_tokens", "cached_tokens", "completion_tokens")
            },
        }
        for name in NAMES
    ]
    assert summary_of(result.stdout)["lora"] == expected
    stats = pq.read_table(tmp_path / "out.stats.parquet").to_pylist()
    per_adapter = [row for row in stats if not row["is_total"] and row["window"] is None]
    assert [
        (row["lora"], row["rows"], row["prompt_tokens"], row["cached_tokens"])
        for row in per_adapter
    ] == [(e["adapter"], e["rows"], e["prompt_tokens"], e["cached_tokens"]) for e in expected]


def split_differences(model_dir, adapters, lines, tmp_path, label) -> list[str]:
    """Ids of rows whose output (tokens, logprobs as floats) differs between one job of all
    `lines` and one job per value of their `group`."""
    mixed_out = tmp_path / f"{label}-mixed.parquet"
    source = write_jsonl(tmp_path / f"{label}-mixed.jsonl", [strip(x) for x in lines])
    assert run_cli(*run_args(model_dir, source, mixed_out, adapters)).exit_code == 0
    mixed = {row["id"]: row for row in read_rows(mixed_out)}
    differing = []
    for group in sorted({x["group"] for x in lines}):
        own = [strip(x) for x in lines if x["group"] == group]
        source = write_jsonl(tmp_path / f"{label}-{group}.jsonl", own)
        out = tmp_path / f"{label}-{group}.parquet"
        assert run_cli(*run_args(model_dir, source, out, adapters)).exit_code == 0
        for row in read_rows(out):
            other = mixed[row["id"]]
            keys = ("completion_token_ids", "logprobs", "completion", "lora")
            if any(row[key] != other[key] for key in keys):
                differing.append(row["id"])
    return differing


def strip(line: dict) -> dict:
    return {k: v for k, v in line.items() if k != "group"}


def test_mixed_job_equals_per_adapter_jobs(tiny_llama_dir, adapters, tmp_path):
    """Bitwise (logprobs compared as floats): 3 adapters and the base, interleaved, in one
    job and in one job each. The same split of the same rows all on the base model must
    agree first (the base engine's batch invariance, which the adapters' rests on)."""
    rows = prompts(16, seed=3)
    base_lines = [
        {"id": f"r{i}", "prompt_token_ids": p, "lora": None, "group": i % 4}
        for i, p in enumerate(rows)
    ]
    assert split_differences(tiny_llama_dir, adapters, base_lines, tmp_path, "base") == []
    lines = [{**x, "lora": NAMES[x["group"]]} for x in base_lines]
    assert split_differences(tiny_llama_dir, adapters, lines, tmp_path, "lora") == []


def test_ray_job_with_adapters_equals_the_local_job(tiny_llama_dir, adapters, tmp_path):
    """`--executor ray`: every worker loads the adapters from their paths; a mixed job's rows
    (tokens, logprobs, lora column) are the local job's, and the summary counts per adapter."""
    pytest.importorskip("ray")
    lines = [
        {"id": f"r{i}", "prompt_token_ids": p, "lora": NAMES[i % 4]}
        for i, p in enumerate(prompts(12, seed=5))
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    local_out, ray_out = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    assert run_cli(*run_args(tiny_llama_dir, source, local_out, adapters)).exit_code == 0
    ray_args = ("--executor", "ray", "--workers", "2", "--worker-threads", "1")
    result = run_cli(*run_args(tiny_llama_dir, source, ray_out, adapters, *ray_args))
    assert result.exit_code == 0, result.output
    keys = ("id", "completion_token_ids", "logprobs", "lora", "prompt_tokens")
    local = [{k: row[k] for k in keys} for row in read_rows(local_out)]
    assert [{k: row[k] for k in keys} for row in read_rows(ray_out)] == local
    counts = {entry["adapter"]: entry["rows"] for entry in summary_of(result.stdout)["lora"]}
    assert counts == {None: 3, "r4": 3, "r16": 3, "attn": 3}


def test_cache_never_hits_across_adapters(tiny_llama_dir, adapters, tmp_path):
    """One prompt of 3 full pages, twice per adapter and base: the second of each hits 48."""
    prompt = prompts(1, seed=9)[0][:20] * 3  # 60 tokens: 3 full pages of 16
    lines = [
        {"id": f"{name}-{k}", "prompt_token_ids": prompt, "lora": name}
        for k in range(2)
        for name in NAMES
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    result = run_cli(*run_args(tiny_llama_dir, source, output, adapters, "--max-num-seqs", "1"))
    assert result.exit_code == 0, result.output
    cached = {row["id"]: row["cached_tokens"] for row in read_rows(output)}
    assert cached == {f"{name}-{k}": 48 * k for name in NAMES for k in range(2)}


def test_openai_body_model_picks_the_adapter(tiny_llama_dir, adapters, tmp_path):
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": model, "prompt": f"Question {i}: what is 2 plus {i}?"},
        }
        for i, model in enumerate(["r16", "some-base-model", "r4"])
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    args = ("--served-model-name", "some-base-model")
    result = run_cli(*run_args(tiny_llama_dir, source, output, adapters, *args))
    assert result.exit_code == 0, result.output
    assert [row["lora"] for row in read_rows(output)] == ["r16", None, "r4"]


def test_unknown_adapter_and_bad_lora_fields_are_row_errors(tiny_llama_dir, adapters, tmp_path):
    lines = [
        {"id": "a", "prompt": "Question 1", "lora": "nope"},
        {"id": "b", "prompt": "Question 2", "lora": 3},
        {"id": "c", "prompt": "Question 3", "lora": "r4"},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    result = run_cli(*run_args(tiny_llama_dir, source, output, adapters))
    assert result.exit_code == 0, result.output
    got = read_rows(output)
    assert [row["error"] for row in got] == [
        "unknown LoRA adapter 'nope'; this job's adapters: r4, r16, attn",
        "lora must be an adapter name or null, got integer",
        None,
    ]
    assert [row["lora"] for row in got] == ["nope", None, "r4"]


def edit_config(path: Path, **changes) -> None:
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_dora": True}, "adapter 'bad' uses DoRA (use_dora), which is not supported"),
        (
            {"modules_to_save": ["lm_head"]},
            "adapter 'bad' uses modules_to_save (fully trained layers), which is not supported",
        ),
        ({"peft_type": "IA3"}, "adapter 'bad' is a IA3 adapter; only LoRA is supported"),
        ({"r": 99}, "adapter 'bad' has rank 99, above --max-lora-rank 64"),
    ],
)
def test_unsupported_adapters_are_refused(tiny_llama_dir, adapters, tmp_path, change, message):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (bad / name).write_bytes((adapters["r4"] / name).read_bytes())
    edit_config(bad, **change)
    assert_refused(tiny_llama_dir, tmp_path, {"bad": bad}, message)


def test_adapter_for_another_base_is_refused(tiny_llama_dir, tiny_qwen2_dir, tmp_path):
    # qwen2 has the same layer names and shapes, but biases on q/k/v: shapes alone pass, so
    # make one whose layer count differs
    other = make_adapter(tiny_qwen2_dir, tmp_path / "other", rank=4, seed=1)
    weights = other / "adapter_model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    renamed = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, weights)
    message = (
        "adapter 'other' targets model.layers.7.mlp.down_proj, which the model does not have "
        "(an adapter for another base model?)"
    )
    assert_refused(tiny_llama_dir, tmp_path, {"other": other}, message)


def test_wrong_shapes_are_refused(tiny_llama_dir, tmp_path):
    other = make_adapter(tiny_llama_dir, tmp_path / "other", rank=4, seed=1)
    weights = other / "adapter_model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    key = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
    tensors[key] = tensors[key][:, :100].contiguous()
    save_file(tensors, weights)
    message = (
        "adapter 'other': model.layers.0.mlp.down_proj maps 100 -> 64 features, the model's "
        "layer 128 -> 64 (an adapter for another base model?)"
    )
    assert_refused(tiny_llama_dir, tmp_path, {"other": other}, message)


def assert_refused(model_dir, tmp_path, adapters, message) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hi"}])
    output = tmp_path / "out.parquet"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli(*run_args(model_dir, source, output, adapters))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"Error: {message}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_lora_option_errors(tiny_llama_dir, adapters, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hi"}])
    output = tmp_path / "out.parquet"
    result = run_cli(*run_args(tiny_llama_dir, source, output, adapters, "--max-loras", "2"))
    assert result.exit_code == 2
    assert (
        "3 LoRA adapters given but --max-loras is 2 (every adapter of a job stays loaded); "
        "raise --max-loras" in result.stderr
    )
    result = run_cli(*run_args(tiny_llama_dir, source, output, {}, "--lora", "nopath"))
    assert result.exit_code == 2
    assert "--lora takes NAME=PATH, got 'nopath'" in result.stderr


def test_lora_table_in_config_file(tiny_llama_dir, adapters, tmp_path):
    config = tmp_path / "job.toml"
    config.write_text(f'[lora]\nr4 = "{adapters["r4"]}"\n')
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hi", "lora": "r4"}])
    output = tmp_path / "out.parquet"
    result = run_cli(*run_args(tiny_llama_dir, source, output, {}, "--config", config))
    assert result.exit_code == 0, result.output
    assert [row["lora"] for row in read_rows(output)] == ["r4"]


def test_resume_refuses_a_changed_adapter(tiny_llama_dir, tmp_path):
    path = make_adapter(tiny_llama_dir, tmp_path / "a", rank=4, seed=1)
    lines = [{"id": f"r{i}", "prompt": f"Question {i}", "lora": "a"} for i in range(200)]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.parquet"
    args = run_args(tiny_llama_dir, source, output, {"a": path}, "--checkpoint-rows", "4")
    checkpoint = Path(checkpoint_dir_for(resolve(str(output))).path)
    stop_after_parts(args, checkpoint, 2, signal.SIGKILL)
    make_adapter(tiny_llama_dir, path, rank=4, seed=2)
    result = run_cli(*args)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: the checkpoint in {checkpoint} was made by a different job (LoRA adapter "
        "'a' has different files); rerun with --restart to discard it and start over, or "
        "restore the original settings to resume"
    )


def test_plan_reports_each_adapter_as_its_own_cache(tiny_llama_dir, tmp_path):
    shared = prompts(1, seed=4)[0][:20] * 3
    lines = [
        {"id": f"r{i}", "prompt_token_ids": [*shared, 5 + i], "lora": NAMES[i % 3]}
        for i in range(9)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    result = run_cli("plan", source, "--model", tiny_llama_dir, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    expected = []
    for name in [None, "r16", "r4"]:  # the base first, then by name
        own = write_jsonl(tmp_path / f"{name}.jsonl", [x for x in lines if x["lora"] == name])
        alone = json.loads(run_cli("plan", own, "--model", tiny_llama_dir, "--json").stdout)
        expected.append(
            {
                "adapter": name,
                **{
                    key: alone[key]
                    for key in (
                        "rows",
                        "prompt_tokens",
                        "reusable_tokens",
                        "predicted_prefill_saving",
                    )
                },
            }
        )
    assert report["adapters"] == expected
    assert [e["rows"] for e in expected] == [3, 3, 3]
    assert all(e["reusable_tokens"] == 2 * 48 for e in expected)


def test_tensor_parallel_job_equals_the_one_process_job(tiny_llama_dir, adapters, tmp_path):
    """`run --lora ... --tensor-parallel-size 2` end to end: every row's tokens and adapter
    are the one-process job's (logprobs may differ in the last bits: the ranks' halves)."""
    rows = prompts(8, seed=3)
    lines = [
        {"id": f"r{i}", "prompt_token_ids": p, "lora": NAMES[i % 4]} for i, p in enumerate(rows)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    outputs = {}
    for size in (1, 2):
        outputs[size] = tmp_path / f"tp{size}.parquet"
        args = run_args(tiny_llama_dir, source, outputs[size], adapters)
        result = run_cli(*args, "--tensor-parallel-size", size)
        assert result.exit_code == 0, result.output
        assert summary_of(result.stdout)["rows"] == 8

    def tokens(path):
        return [(r["id"], r["lora"], r["completion_token_ids"]) for r in read_rows(path)]

    assert tokens(outputs[2]) == tokens(outputs[1])
    assert {lora for _, lora, _ in tokens(outputs[2])} == set(NAMES)
