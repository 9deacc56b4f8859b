"""`--task score` and `--task embed` under `--executor ray`: the same rows as a local run.

Score rows are keyed and sharded by their contexts (rows sharing a few-shot context form one
prefix group, so one worker's cache computes the context once), their estimated work is the
context plus each continuation's tokens but the last; embed rows carry the job's pooling to
the workers. The end-to-end runs use one worker (short); the sharding of score rows is
checked on Ray's own stages without Ray (they are plain callables)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobs.jobkit import run_cli, summary_of, write_jsonl

from astrai_batch.io import open_input
from astrai_batch.jobs.executors.ray_stages import ChunkReader, summaries_of, summarize_batch
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.planning.sharding import assign_shards

SHOTS = [
    "Q: two plus two? A: four.\nQ: one plus one? A: two.\nQ: three plus three? A: six.\n",
    "Translate to German: the weather is nice today.\nGerman: das Wetter ist schoen.\n",
]


def score_rows(count: int) -> list[dict]:
    rows = [
        {
            "id": f"q{i}",
            "context": SHOTS[i % 2] + f"Q: question number {i}? A:",
            "continuations": [" yes", " no, not at all", f" {i}"],
        }
        for i in range(count)
    ]
    rows[3] = {"id": "q3", "context": "Q: A:", "continuations": []}  # a row error
    return rows


def embed_rows(count: int) -> list[dict]:
    rows: list[dict] = [
        {"id": f"e{i}", "prompt": SHOTS[i % 2] + f"Document {i} about prefix caching."}
        for i in range(count)
    ]
    rows[2] = {"id": "e2", "prompt": "text", "max_tokens": 3}  # a row error
    return rows


def run_both(tmp_path: Path, name: str, rows: list[dict], *args: str):
    source = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    outputs = tmp_path / f"{name}-local.parquet", tmp_path / f"{name}-ray.parquet"
    ray = ("--executor", "ray", "--workers", "1", "--worker-threads", "1")
    for output, extra in zip(outputs, ((), ray), strict=True):
        result = run_cli("run", source, output, *args, "--kv-cache-memory", "8MiB", "-q", *extra)
        assert result.exit_code == 0, result.stderr
        assert summary_of(result.stdout)["status"] == "completed_with_errors"
    return [pq.read_table(path) for path in outputs]


def without_cache_counts(table: pa.Table) -> list[dict]:
    """Every column but `cached_tokens`, which depends on what ran before a row."""
    return table.drop_columns(["cached_tokens"]).to_pylist()


@pytest.mark.usefixtures("ray_address")
def test_score_and_embed_rows_on_ray_equal_the_local_run(tiny_llama_dir, tmp_path):
    model = ("--model", str(tiny_llama_dir))
    local, sharded = run_both(tmp_path, "score", score_rows(12), *model, "--task", "score")
    assert sharded.schema == local.schema
    assert without_cache_counts(sharded) == without_cache_counts(local)
    assert sharded.column("error").to_pylist()[3] == "continuations is empty"
    assert local.column("loglikelihoods").null_count == 1

    local, sharded = run_both(
        tmp_path, "embed", embed_rows(8), *model, "--task", "embed", "--pooling", "mean"
    )
    assert sharded.schema == local.schema  # fixed_size_list<float>[hidden size] on both
    assert without_cache_counts(sharded) == without_cache_counts(local)
    assert sharded.column("error").to_pylist()[2] == "max_tokens is not a field of --task embed"


def test_score_rows_are_sharded_by_their_contexts(tiny_llama_dir, tmp_path):
    rows = score_rows(40)
    config = JobConfig.from_options({"model": str(tiny_llama_dir), "task": "score"})
    source = open_input(write_jsonl(tmp_path / "in.jsonl", rows), **config.input_options())
    keyed = ChunkReader(source, config, 256, config.model)(pa.table({"id": [0]}))
    by_row = {
        index: (group, work, tokens)
        for index, group, work, tokens in zip(
            keyed.column("index").to_pylist(),
            keyed.column("group").to_pylist(),
            keyed.column("max_new").to_pylist(),
            keyed.column("tokens").to_pylist(),
            strict=True,
        )
    }
    assert by_row[3] == (None, 0, None)  # the row error belongs to no group
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    for index in (0, 1):  # work after the context: each continuation's tokens but its last
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        context = encode(rows[index]["context"])
        assert by_row[index][2] == context  # the row's prompt is its context
        whole = [encode(rows[index]["context"] + c) for c in rows[index]["continuations"]]
        assert by_row[index][1] == sum(len(tokens) - len(context) - 1 for tokens in whole)
    groups: dict[str, set] = {}
    for index, (group, _, _) in by_row.items():
        if group is not None:
            groups.setdefault(SHOTS[index % 2], set()).add(group)
    assert [len(keys) for keys in groups.values()] == [1, 1]  # one group per few-shot context
    table = keyed.filter(pa.compute.is_valid(keyed.column("group")))
    summaries = [
        summarize_batch(table.filter(pa.compute.equal(table.column("group"), key)), page_size=16)
        for key in sorted(set(table.column("group").to_pylist()))
    ]
    plan = assign_shards(summaries_of(pa.concat_tables(summaries).to_pylist()), 2, 16)
    shards: dict[str, set] = {}
    for index, (group, _, tokens) in by_row.items():
        if group is not None:
            shards.setdefault(SHOTS[index % 2], set()).add(plan.route(group, tokens))
    assert [len(s) for s in shards.values()] == [1, 1]  # each context's rows on one shard
    assert shards[SHOTS[0]] != shards[SHOTS[1]]  # and the two contexts on different shards
