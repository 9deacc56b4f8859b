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


def _reference(path: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """llama-cpp-python's own high-level API, one prompt alone: evaluate, take the argmax."""
    llm = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=1, logits_all=False, verbose=False)
    out: list[int] = []
    llm.eval(prompt)
    for _ in range(max_tokens):
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        out.append(token)
        llm.eval([token])
    llm.close()
    return out


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
    alone = [_reference(path, list(p), 8) for p in prompts.prompt_token_ids]
    figures = agreement([list(p) for p in prompts.prompt_token_ids], batched, alone)
    # Q4_1 kernels may round a 64-row batch differently from a 1-row one, so a near-tie can
    # flip; a prefix or a sequence id mixed up would agree on almost nothing.
    assert figures["token_agreement"] >= 0.9, figures


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
