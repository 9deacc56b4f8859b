"""The device check's batch-invariance step: the crowd test on the device, invariant numerics.

Half of a set of prompts of mixed lengths (a third share one of two prefixes) run alone, one
at a time; then all of them together at several token budgets, with the prefix cache on and
off; every generated position's logits must be `torch.equal` (`invariance_probe.crowd_check`,
the comparison the engine makes at start, at a larger size).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from astrai_batch.bench.random_models import ModelShape, build_model
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.numerics.invariance_probe import crowd_check

# (token budget, prefix cache) of each crowd
CROWDS = ((64, True), (256, False), (1024, True))


def crowd_prompts(vocab_size: int, count: int, seed: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab_size) for _ in range(rng.randint(40, 70))] for _ in "ab"]
    prompts = []
    for i in range(count):
        tail = [rng.randrange(3, vocab_size) for _ in range(rng.choice([2, 9, 17, 33, 80, 150]))]
        prompts.append(prefixes[i % 2] + tail if i % 3 == 0 else tail)
    return prompts


def batch_invariance(
    shape: ModelShape, dtype: torch.dtype, device: torch.device, prompts: int, max_tokens: int
) -> dict:
    loaded = build_model(shape, device=device, dtype=dtype)
    rows = crowd_prompts(shape.vocab_size, prompts)
    pages = sum(-(-(len(p) + max_tokens) // 16) for p in rows) + 8
    base = EngineConfig(num_pages=pages, max_num_seqs=len(rows), cuda_graphs=False)
    crowds = [
        dataclasses.replace(base, max_num_batched_tokens=budget, enable_prefix_cache=cache)
        for budget, cache in CROWDS
    ]
    alone = dataclasses.replace(base, max_num_seqs=1, enable_prefix_cache=False)
    watched = range(len(rows) // 2)

    def make_core(config: EngineConfig, model=loaded) -> EngineCore:
        return EngineCore(model, config, invariance_probe=False)

    difference = crowd_check(make_core, rows, watched, crowds, alone=alone, max_tokens=max_tokens)
    del loaded, make_core  # the model's memory before the next step
    return {
        "model": shape.name,
        "dtype": str(dtype).removeprefix("torch."),
        "numerics": "invariant",
        "prompts": len(rows),
        "watched_rows": len(watched),
        "max_tokens": max_tokens,
        "crowds": [{"token_budget": b, "prefix_cache": c} for b, c in CROWDS],
        "difference": difference,
        "passed": difference is None,
    }
