"""gpu_check's tensor-parallel step: two ranks (NCCL) against one, where 2+ GPUs exist.

The tiny shape (4 query heads, 2 KV heads) with random weights is saved to a temporary
directory (ranks read their shards from safetensors) and run greedy on one GPU and over
two; float32 tokens must agree row for row. Skipped, with the reason, elsewhere: on CPU the
test suite runs the same comparison over gloo.
"""

from __future__ import annotations

import tempfile
import time

import torch

from astrai_batch.bench.greedy_agreement import agreement, engine_greedy
from astrai_batch.bench.random_models import TINY, build_model
from astrai_batch.engine.model.loader import load_model

RANKS = 2


def tensor_parallel_check(device: torch.device, prompts: int = 16, max_tokens: int = 32) -> dict:
    if device.type != "cuda":
        # nothing to judge here (as attention_backends without kernels): a pass, with why
        reason = "needs CUDA; on CPU the test suite checks tensor parallelism (gloo)"
        return {"skipped": reason, "passed": True}
    count = torch.cuda.device_count()
    if count < RANKS:
        return {"skipped": f"needs {RANKS} GPUs, found {count}", "passed": True}
    built = build_model(TINY, device=torch.device("cpu"), dtype=torch.float32)
    vocab = built.model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    token_ids = [
        torch.randint(3, vocab, (int(n),), generator=generator).tolist()
        for n in torch.randint(4, 200, (prompts,), generator=generator)
    ]
    with tempfile.TemporaryDirectory() as saved:
        built.model.save_pretrained(saved)
        built.tokenizer.save_pretrained(saved)
        timed = {}
        outputs = {}
        for size in (1, RANKS):
            loaded = load_model(saved, device=str(device), tensor_parallel_size=size)
            try:
                began = time.perf_counter()
                outputs[size] = engine_greedy(loaded, token_ids, max_tokens)
                timed[size] = round(time.perf_counter() - began, 3)
            finally:
                loaded.close()
    result = {
        "model": TINY.name,
        "ranks": RANKS,
        "seconds_by_ranks": timed,
        **agreement(token_ids, outputs[RANKS], outputs[1]),
    }
    result["passed"] = result["exact_rows"] == result["rows"]
    return result
