"""The llama-cpp peer against the real llama.cpp, on SmolLM2's packaged Q4_1 GGUF.

Long (scripts/test-long) and never in CI: llama-cpp-python builds llama.cpp from source; put
a build on the path (PYTHONPATH=/path/to/llama-cpp-python) to run these."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.greedy_agreement import agreement
from astrai_batch.bench.llama_cpp_peer import LlamaCppPeer, gguf_path
from astrai_batch.bench.prompts import load_prompts
from astrai_batch.bench.results import read_results
from astrai_batch.cli import main
from astrai_batch.engine import load_tokenizer

pytestmark = pytest.mark.long
llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python (the extra 'llama-cpp') is not installed"
)

MODEL = "smollm2-135m"
SMALL = ("--num-system-prompts", "2", "--questions-per-prompt", "3", "--max-tokens", "8")


def _reference(path: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt alone through llama.cpp's simplest path (`llama_batch_get_one`: one
    sequence, the whole prompt then one token per call), none of the peer's planning."""
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False  # as the peer: the AMX buffer's matmul crashes
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    outputs = []
    for prompt in prompts:
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx, context_params.n_threads = 1024, 1
        ctx = llama_cpp.llama_init_from_model(model, context_params)
        tokens, out = list(prompt), []
        for _ in range(max_tokens):
            array = (llama_cpp.llama_token * len(tokens))(*tokens)
            assert (
                llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(array, len(tokens))) == 0
            )
            logits = llama_cpp.llama_get_logits_ith(ctx, -1)
            row = [logits[i] for i in range(vocab)]
            tokens = [max(range(vocab), key=row.__getitem__)]
            out.append(tokens[0])
        llama_cpp.llama_free(ctx)
        outputs.append(out)
    llama_cpp.llama_model_free(model)
    return outputs


def test_the_batched_shared_prefix_run_decodes_what_each_prompt_alone_decodes() -> None:
    config = BenchConfig(model=MODEL, num_system_prompts=2, questions_per_prompt=3, max_tokens=8)
    tokenizer, _ = load_tokenizer(MODEL)
    prompts = load_prompts(config, tokenizer, MODEL)
    path = gguf_path(MODEL)
    peer = LlamaCppPeer(path, prompts, threads=1)
    try:
        batched = peer.generate([list(p) for p in prompts.prompt_token_ids], 8)
    finally:
        peer.close()
    alone = _reference(path, [list(p) for p in prompts.prompt_token_ids], 8)
    figures = agreement([list(p) for p in prompts.prompt_token_ids], batched, alone)
    # llama.cpp's results depend on the batch (a 512-token chunk of several prompts rounds
    # unlike one prompt alone), so a near-tie can flip and the continuation drift; a prefix
    # or a sequence id mixed up would agree on almost nothing.
    assert [row[0] for row in batched] == [row[0] for row in alone]
    assert figures["token_agreement"] >= 0.6, figures


def test_bench_runs_llama_cpp_beside_ours_with_its_agreement(tmp_path: Path) -> None:
    out = tmp_path / "results.parquet"
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(
            main,
            ["bench", "--model", MODEL, "--threads", "1", *SMALL, "--repeat", "1",
             "--peers", "llama-cpp", "--no-floor", "--out", str(out)],
            catch_exceptions=False,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.stderr
    ours, peer = read_results(out)
    assert (ours["system"], peer["system"]) == ("astrai", "llama-cpp")
    assert peer["generated_tokens"] == 6 * 8
    assert json.loads(peer["system_config"])["kv_unified"] is True
    assert 0.5 <= peer["greedy_agreement"] <= 1.0
    assert peer["greedy_leading_agreement"] <= peer["greedy_agreement"]
    assert "llama-cpp greedy agreement with astrai: " in result.stderr
    assert "astrai roofline: " in result.stderr


def test_the_peer_in_its_own_process_gives_the_in_process_tokens() -> None:
    """`LlamaCppProcess` (what `bench` and scripts/bench_llama_cpp.py run) returns the run a
    `LlamaCppPeer` in this process makes: same tokens, the peer's config, its own timing."""
    from astrai_batch.bench.llama_cpp_peer import run_llama_cpp
    from astrai_batch.bench.llama_cpp_process import LlamaCppProcess

    config = BenchConfig(model=MODEL, num_system_prompts=2, questions_per_prompt=2, max_tokens=4)
    tokenizer, _ = load_tokenizer(MODEL)
    prompts = load_prompts(config, tokenizer, MODEL)
    path = gguf_path(MODEL)
    peer = LlamaCppPeer(path, prompts, threads=1)
    try:
        here = run_llama_cpp(peer, prompts, 0)
    finally:
        peer.close()
    child = LlamaCppProcess(path, prompts, threads=1)
    try:
        there = child.run(prompts, 0)
        assert child.config() == json.loads(here.system_config)
    finally:
        child.close()
    assert there.token_ids == here.token_ids
    assert there.generated_tokens == here.generated_tokens == 4 * prompts.num_prompts
    assert there.wall_seconds > 0 and there.peak_rss_bytes > 0
