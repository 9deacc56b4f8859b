"""Runs requests through the engine core and keeps every sampled position's logits."""

from __future__ import annotations

import pytest
import torch

from astrai_batch.bench.invariance_check import crowd_prompts
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True)


def run_capturing(loaded, requests, config: EngineConfig):
    """{request id: (token ids, [logits of each generated position])} and the engine stats."""
    core = EngineCore(loaded, config)
    return capture_rows(core, requests), core.stats()


def assert_alone_equals_crowds(
    loaded, requests, watched, budgets, *, page_size: int = 8, pages: int = 64
) -> list:
    """Each watched row alone (no prefix cache), then every row together (prefix cache on,
    twice the pages) at each token budget: the watched rows' tokens and logits the same
    bits. Returns each crowd run's stats."""
    alone: dict = {}
    for i in watched:
        config = EngineConfig(page_size=page_size, num_pages=pages, enable_prefix_cache=False)
        alone.update(run_capturing(loaded, [requests[i]], config)[0])
    stats = []
    for budget in budgets:
        config = EngineConfig(
            page_size=page_size, num_pages=2 * pages, max_num_batched_tokens=budget
        )
        crowd, crowd_stats = run_capturing(loaded, requests, config)
        assert_same_rows(alone, crowd, watched)
        stats.append(crowd_stats)
    return stats


def run_one_after_another(core: EngineCore, requests) -> list:
    """Each request run to its end before the next is added (so a later one can read the
    earlier ones' pages from the prefix cache); their results in order, invariants checked."""
    results = []
    for request in requests:
        assert core.add_request(request) == []
        while core.num_unfinished:
            results.extend(core.step())
    core.check_invariants()
    return results


def capture_rows(core: EngineCore, requests) -> dict:
    """{request id: (token ids, [logits of each generated position])} of a run on `core`."""
    logits: dict = {}
    core.logits_observer = lambda rid, _i, row: logits.setdefault(rid, []).append(row.clone())
    tokens = {}
    for request in requests:
        assert core.add_request(request) == []
    while core.num_unfinished:
        for result in core.step():
            tokens[result.request_id] = result.token_ids
    core.check_invariants()
    return {rid: (tokens[rid], logits[rid]) for rid in tokens}


def invariance_prompts(vocab_size: int, count: int, seed: int) -> list[list[int]]:
    """Mixed lengths (2 to 150 tokens); a third share one of two prefixes of 40-70 tokens:
    the device check's crowd (`bench.invariance_check`), run here on CPU."""
    return crowd_prompts(vocab_size, count, seed)


def requests_for(prompts, ids, params) -> list[GenerationRequest]:
    return [GenerationRequest(i, prompts[i], params) for i in ids]


def mixed_requests(prompts, ids) -> list[GenerationRequest]:
    """Rows `ids` of `prompts`, greedy (even ids) and sampled (odd ids)."""
    return [r for i in ids for r in requests_for(prompts, [i], SAMPLED if i % 2 else GREEDY)]


def assert_same_rows(alone: dict, crowd: dict, ids) -> None:
    for rid in ids:
        tokens_a, logits_a = alone[rid]
        tokens_c, logits_c = crowd[rid]
        assert tokens_a == tokens_c, f"row {rid}: tokens differ"
        assert len(logits_a) == len(logits_c)
        for position, (a, c) in enumerate(zip(logits_a, logits_c, strict=True)):
            assert torch.equal(a, c), f"row {rid}: logits of generated position {position} differ"


def use_cuda_kernels_on_cpu(monkeypatch) -> None:
    """Engines built from here on run CUDA's invariant operations (the Triton attention and
    norm means) on the CPU, through Triton's interpreter (slow: keep to a few prompts)."""
    pytest.importorskip("triton")
    from astrai_batch.engine.attention.kernels.invariant_triton import invariant_attention
    from astrai_batch.engine.runner import invariant_plan
    from astrai_batch.engine.runner.norm_triton import mean_squares

    monkeypatch.setattr(
        invariant_plan, "invariant_cuda_ops", lambda device: (invariant_attention, mean_squares)
    )
