"""`astrai-batch run` end to end with the tiny models: every row shape, both output formats,
input order, statistics and metadata."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import (
    SYSTEM_PROMPTS,
    engine_args,
    listing,
    question,
    read_rows,
    run_cli,
    shared_prefix_prompts,
    start_process,
    summary_of,
    write_jsonl,
    write_parquet,
)
from transformers import AutoTokenizer

from astrai_batch import __version__
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats


def first_page_ranks(model_dir: Path) -> dict[int, int]:
    """System prompt number -> its place in token order (the order prefix groups run in)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pages = [tokenizer(prompt)["input_ids"][:16] for prompt in SYSTEM_PROMPTS]
    return {kind: rank for rank, kind in enumerate(sorted(range(3), key=pages.__getitem__))}


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


def test_prompt_rows_keep_input_order_and_stats_agree_with_rows(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    prompts = shared_prefix_prompts(24)
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"id": f"row-{i}", "prompt": p} for i, p in enumerate(prompts)]
    )
    output = out_dir / "out.parquet"

    result = run_cli("run", source, output, *engine_args(tiny_llama_dir))

    assert result.exit_code == 0, result.stderr
    summary = summary_of(result.stdout)
    assert summary["status"] == "completed"
    assert (summary["rows"], summary["rows_done"], summary["failed_rows"]) == (24, 24, 0)
    assert listing(out_dir) == ["out.parquet", "out.stats.parquet"]

    rows = read_rows(output)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    token_ids = [tokenizer(p)["input_ids"] for p in prompts]
    assert [row["id"] for row in rows] == [f"row-{i}" for i in range(24)]
    assert [row["prompt_tokens"] for row in rows] == [len(ids) for ids in token_ids]
    assert all(row["sample_index"] == 0 and row["error"] is None for row in rows)
    assert all(row["finish_reason"] in ("stop", "length") for row in rows)
    assert all(1 <= row["completion_tokens"] <= 4 for row in rows)
    # Same first page <=> same prefix group.
    for a, row_a in enumerate(rows):
        for b, row_b in enumerate(rows):
            same_page = token_ids[a][:16] == token_ids[b][:16]
            assert (row_a["prefix_group"] == row_b["prefix_group"]) == same_page

    # With grouping and a roomy cache the engine reuses exactly what the ideal cache would.
    cached = sum(row["cached_tokens"] for row in rows)
    assert cached == ideal_prefix_stats(token_ids, page_size=16).reusable_tokens > 0

    stats = read_rows(out_dir / "out.stats.parquet")
    assert [(s["window"], s["is_total"]) for s in stats] == [(0, False), (None, True)]
    totals = stats[-1]
    assert totals["rows"] == 24
    assert totals["cached_tokens"] == cached == summary["cached_tokens"]
    assert totals["prompt_tokens"] == sum(row["prompt_tokens"] for row in rows)
    assert totals["decode_tokens"] == sum(row["completion_tokens"] for row in rows)
    assert totals["hit_rate"] == cached / totals["prompt_tokens"]

    metadata = pq.read_schema(output).metadata
    config = json.loads(metadata[b"astrai_batch.config"])
    assert (config["max_tokens"], config["model"], config["page_size"]) == (
        4,
        str(tiny_llama_dir),
        16,
    )
    assert json.loads(metadata[b"astrai_batch.model"])["architecture"] == "LlamaForCausalLM"
    assert metadata[b"astrai_batch.version"].decode() == __version__
    assert json.loads(metadata[b"astrai_batch.input"])["files"][0]["path"] == str(source)
    assert (
        pq.read_schema(out_dir / "out.stats.parquet").metadata[b"astrai_batch.config"]
        == (metadata[b"astrai_batch.config"])
    )


def test_completions_equal_the_engine_on_the_same_prompts(
    tiny_qwen2_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    from astrai_batch.engine import GenerationRequest, SamplingParams, generate_sync, load_model

    prompts = shared_prefix_prompts(6)
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in prompts])
    result = run_cli("run", source, out_dir / "out.parquet", *engine_args(tiny_qwen2_dir))
    assert result.exit_code == 0, result.stderr

    loaded = load_model(tiny_qwen2_dir)
    requests = [
        GenerationRequest(i, loaded.tokenizer(p)["input_ids"], SamplingParams(max_tokens=4))
        for i, p in enumerate(prompts)
    ]
    expected, _ = generate_sync(loaded, requests)
    rows = read_rows(out_dir / "out.parquet")
    assert [row["id"] for row in rows] == [str(i) for i in range(6)]
    assert [row["completion"] for row in rows] == [r.text for r in expected]
    assert [row["finish_reason"] for row in rows] == [r.finish_reason for r in expected]


def test_windows_restart_group_ids_and_keep_results(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in shared_prefix_prompts(12)])
    whole = run_cli("run", source, out_dir / "whole.parquet", *engine_args(tiny_llama_dir))
    windowed = run_cli(
        "run",
        source,
        out_dir / "windowed.parquet",
        *engine_args(tiny_llama_dir, "--group-window", "5"),
    )
    assert whole.exit_code == windowed.exit_code == 0

    whole_rows = read_rows(out_dir / "whole.parquet")
    windowed_rows = read_rows(out_dir / "windowed.parquet")
    assert [r["completion"] for r in windowed_rows] == [r["completion"] for r in whole_rows]
    # Windows of 5, 5 and 2 rows with 3, 3 and 2 groups; ids continue across windows.
    ranks = first_page_ranks(tiny_llama_dir)
    kinds = [(i * 2) % 3 for i in range(12)]
    expected = [ranks[k] for k in kinds[:10]]
    expected[5:10] = [3 + rank for rank in expected[5:10]]
    last = sorted({ranks[k] for k in kinds[10:]})
    expected += [6 + last.index(ranks[k]) for k in kinds[10:]]
    assert [r["prefix_group"] for r in windowed_rows] == expected
    stats = read_rows(out_dir / "windowed.stats.parquet")
    assert [(s["window"], s["rows"]) for s in stats] == [(0, 5), (1, 5), (2, 2), (None, 12)]


def test_no_grouping_changes_order_not_results(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in shared_prefix_prompts(9)])
    grouped = run_cli("run", source, out_dir / "g.parquet", *engine_args(tiny_llama_dir))
    plain = run_cli(
        "run", source, out_dir / "p.parquet", *engine_args(tiny_llama_dir, "--no-grouping")
    )
    assert grouped.exit_code == plain.exit_code == 0
    grouped_rows, plain_rows = read_rows(out_dir / "g.parquet"), read_rows(out_dir / "p.parquet")
    assert [r["completion"] for r in plain_rows] == [r["completion"] for r in grouped_rows]
    # Groups are numbered in execution order: input order without grouping, token order with.
    assert [r["prefix_group"] for r in plain_rows] == [0, 1, 2] * 3
    ranks = first_page_ranks(tiny_llama_dir)
    assert [r["prefix_group"] for r in grouped_rows] == [ranks[(i * 2) % 3] for i in range(9)]


def test_messages_rows_are_rendered_with_the_chat_template(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    conversations = [
        [
            {"role": "system", "content": SYSTEM_PROMPTS[i % 2]},
            {"role": "user", "content": question(i)},
        ]
        for i in range(6)
    ]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations])
    result = run_cli("run", source, out_dir / "out.parquet", *engine_args(tiny_llama_dir))
    assert result.exit_code == 0, result.stderr

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    expected = [
        tokenizer(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False))
        for c in conversations
    ]
    rows = read_rows(out_dir / "out.parquet")
    assert [row["prompt_tokens"] for row in rows] == [len(e["input_ids"]) for e in expected]
    assert all(row["error"] is None for row in rows)


def test_token_id_rows_from_parquet_with_kept_columns_tokens_and_logprobs(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_parquet(
        tmp_path / "in.parquet",
        {
            "id": [10, 11, 12],
            "prompt_token_ids": [[5, 6, 7, 8], [5, 6, 7, 9], [40, 41]],
            "topic": ["a", "b", None],
            "weight": [0.5, 1.5, 2.5],
        },
    )
    output = out_dir / "out.parquet"
    result = run_cli(
        "run",
        source,
        output,
        *engine_args(tiny_llama_dir),
        "--keep-columns",
        "topic,weight",
        "--save-tokens",
        "--logprobs",
    )
    assert result.exit_code == 0, result.stderr

    schema = pq.read_schema(output)
    assert schema.names == [
        "id",
        "sample_index",
        "completion",
        "finish_reason",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "prefix_group",
        "error",
        "completion_token_ids",
        "logprobs",
        "topic",
        "weight",
    ]
    assert schema.field("weight").type == pa.float64()
    rows = read_rows(output)
    assert [(r["id"], r["topic"], r["weight"]) for r in rows] == [
        ("10", "a", 0.5),
        ("11", "b", 1.5),
        ("12", None, 2.5),
    ]
    assert [r["prompt_tokens"] for r in rows] == [4, 4, 2]
    for row in rows:
        assert len(row["completion_token_ids"]) == len(row["logprobs"]) == row["completion_tokens"]
        assert all(value <= 0.0 for value in row["logprobs"])


def test_n_samples_give_one_row_each_and_a_seed_reproduces_them(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(3)])
    sampling = ("--n", "2", "--temperature", "1.5", "--seed", "7")
    first = run_cli("run", source, out_dir / "a.parquet", *engine_args(tiny_llama_dir, *sampling))
    again = run_cli("run", source, out_dir / "b.parquet", *engine_args(tiny_llama_dir, *sampling))
    assert first.exit_code == again.exit_code == 0

    rows = read_rows(out_dir / "a.parquet")
    assert [(r["id"], r["sample_index"]) for r in rows] == [
        ("0", 0),
        ("0", 1),
        ("1", 0),
        ("1", 1),
        ("2", 0),
        ("2", 1),
    ]
    assert rows == read_rows(out_dir / "b.parquet")
    assert summary_of(first.stdout)["output_rows"] == 6


def test_openai_batch_lines_in_and_out(tiny_llama_dir: Path, tmp_path: Path, out_dir: Path) -> None:
    requests = [
        {
            "custom_id": "chat-1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "any", "messages": [{"role": "user", "content": question(1)}]},
        },
        {
            "custom_id": "text-2",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "any", "prompt": question(2), "max_tokens": 2, "n": 2},
        },
        {
            "custom_id": "embed-3",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"input": "x"},
        },
        {
            "custom_id": "bad-4",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": "x"},
        },
    ]
    source = write_jsonl(tmp_path / "batch.jsonl", requests)
    output = out_dir / "results.jsonl"
    result = run_cli(
        "run",
        source,
        output,
        *engine_args(tiny_llama_dir),
        "--output-format",
        "openai-jsonl",
        "--served-model-name",
        "any",
    )
    assert result.exit_code == 0, result.stderr
    assert listing(out_dir) == ["results.jsonl", "results.stats.parquet"]

    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(line["id"], line["custom_id"]) for line in lines] == [
        ("batch_req_0", "chat-1"),
        ("batch_req_1", "text-2"),
        ("batch_req_2", "embed-3"),
        ("batch_req_3", "bad-4"),
    ]
    chat = lines[0]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["model"] == "any"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 4
    text = lines[1]["response"]["body"]
    assert text["object"] == "text_completion"
    assert [choice["index"] for choice in text["choices"]] == [0, 1]
    assert text["usage"]["completion_tokens"] <= 2 * 2
    # the url decides the task: an embeddings line embeds in a generate job
    assert lines[2]["response"]["body"]["object"] == "list"
    assert lines[3]["response"] is None
    assert lines[3]["error"] == {
        "code": "invalid_request",
        "message": "url must be /v1/chat/completions, /v1/completions or /v1/embeddings, "
        "got '/v1/responses'",
    }


def test_openai_output_for_prompt_rows_uses_row_ids(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "q-a", "prompt": question(3)}])
    output = out_dir / "out.jsonl"
    args = (*engine_args(tiny_llama_dir), "--output-format", "openai-jsonl", "--logprobs")
    assert run_cli("run", source, output, *args).exit_code == 0
    (line,) = [json.loads(text) for text in output.read_text().splitlines()]
    assert line["custom_id"] == "q-a"
    choice = line["response"]["body"]["choices"][0]
    assert (
        len(choice["logprobs"]["tokens"]) == line["response"]["body"]["usage"]["completion_tokens"]
    )


def test_toml_config_holds_options_and_flags_override_it(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(2)])
    config = tmp_path / "job.toml"
    config.write_text(
        f'model = "{tiny_llama_dir}"\nmax-tokens = 2\nkv_cache_memory = "8MiB"\nquiet = true\n'
    )
    result = run_cli("run", source, out_dir / "a.parquet", "--config", config, "--max-tokens", "3")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    metadata = pq.read_schema(out_dir / "a.parquet").metadata[b"astrai_batch.config"]
    options = json.loads(metadata)
    assert (options["max_tokens"], options["kv_cache_memory"], options["quiet"]) == (
        3,
        8 << 20,
        True,
    )

    config.write_text('bogus = 1\nmax_tokens = 2\n"top-kk" = 3\n')
    refused = run_cli("run", source, out_dir / "b.parquet", "--config", config)
    assert refused.exit_code == 2
    assert f"Error: unknown option(s) in {config}: bogus, top_kk" in refused.stderr
    assert listing(out_dir) == ["a.parquet", "a.stats.parquet"]


def test_summary_json_file(tiny_llama_dir: Path, tmp_path: Path, out_dir: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(1)}])
    summary_path = tmp_path / "summary.json"
    result = run_cli(
        "run",
        source,
        out_dir / "out.parquet",
        *engine_args(tiny_llama_dir),
        "--summary-json",
        summary_path,
    )
    assert result.exit_code == 0
    assert json.loads(summary_path.read_text()) == summary_of(result.stdout)


def test_subprocess_run_from_parquet_logs_progress_on_stderr(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    source = write_parquet(
        tmp_path / "in.parquet", {"text": [question(i) for i in range(5)], "key": list("abcde")}
    )
    output = out_dir / "out.parquet"
    process = start_process(
        "run",
        source,
        output,
        "--model",
        tiny_llama_dir,
        "--max-tokens",
        "3",
        "--kv-cache-memory",
        "8MiB",
        "--prompt-column",
        "text",
        "--id-column",
        "key",
        "--threads",
        "1",
    )
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert len(stdout.strip().splitlines()) == 1
    assert f"astrai-batch: loading model {tiny_llama_dir} (1 CPU thread)" in stderr
    assert summary_of(stdout)["output"] == str(output)
    assert f"astrai-batch: 5 rows (prompt) in {source}" in stderr
    assert "astrai-batch: 5/5 rows (100.0%)" in stderr
    assert [row["id"] for row in read_rows(output)] == list("abcde")


def test_gzipped_jsonl_and_a_directory_of_parquet_files(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    plain = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(3)])
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    folder = tmp_path / "parts"
    folder.mkdir()
    write_parquet(folder / "a.parquet", {"prompt": [question(0), question(1)]})
    write_parquet(folder / "b.parquet", {"prompt": [question(2)]})

    for source, name in ((plain, "plain"), (packed, "packed"), (folder, "folder")):
        result = run_cli("run", source, out_dir / f"{name}.parquet", *engine_args(tiny_llama_dir))
        assert result.exit_code == 0, result.stderr
    expected = read_rows(out_dir / "plain.parquet")
    assert [r["id"] for r in expected] == ["0", "1", "2"]
    assert read_rows(out_dir / "packed.parquet") == expected
    assert read_rows(out_dir / "folder.parquet") == expected


def test_contiguous_kv_layout_writes_the_rows_the_paged_one_does(
    tiny_llama_dir: Path, tmp_path: Path, out_dir: Path
) -> None:
    prompts = shared_prefix_prompts(12)
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in prompts])
    rows = {}
    for layout in ("paged", "contiguous"):
        output = out_dir / f"{layout}.parquet"
        result = run_cli("run", source, output, *engine_args(tiny_llama_dir, "--kv-layout", layout))
        assert result.exit_code == 0, result.stderr
        rows[layout] = read_rows(output)
    assert [row["completion"] for row in rows["contiguous"]] == [
        row["completion"] for row in rows["paged"]
    ]
    assert sum(row["cached_tokens"] for row in rows["paged"]) > 0
    assert all(row["cached_tokens"] == 0 for row in rows["contiguous"])

    refused = run_cli("run", source, out_dir / "x.parquet", "--kv-layout", "ring")
    assert refused.exit_code == 2
    assert "Invalid value for '--kv-layout': 'ring' is not one of 'paged', 'contiguous'." in (
        refused.stderr
    )
