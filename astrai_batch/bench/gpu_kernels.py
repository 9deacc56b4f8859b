"""The device check's attention-backend step: each paged kernel against the SDPA path.

For every kernel backend (`flashinfer`, `flash-attn`) that can run here: greedy tokens with
the kernel against greedy tokens with the SDPA path, both under fast numerics in bfloat16
(a kernel never keeps batch invariance, so it only runs with fast numerics), and the
shared-prefix bench with the kernel beside the same bench on the SDPA path, alternating, in
one process. A backend that cannot run says why ("not installed", "needs a CUDA device").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.random_models import ModelShape, build_model
from astrai_batch.engine.attention.backends import AUTO_ORDER, BACKEND_SPECS, module_importable
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel

# The share of greedy tokens that must agree with the SDPA path. bfloat16 sums in another
# order can flip a near-tie, after which a row's continuation differs; random-weight models
# with a wide init have few near-ties, so nearly every token must agree.
MIN_AGREEMENT = 0.9

Greedy = Callable[[LoadedModel, list[list[int]], int, EngineConfig], list[list[int]]]


def runnable_kernels(device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Kernel backends that can run on `device`, and why each other one cannot."""
    usable, skipped = [], {}
    for name in AUTO_ORDER:
        if device.type != "cuda":
            skipped[name] = "needs a CUDA device"
        elif not module_importable(BACKEND_SPECS[name].module):
            skipped[name] = "not installed"
        else:
            usable.append(name)
    return usable, skipped


def kernel_config(base: EngineConfig, backend: str) -> EngineConfig:
    """`base` under fast numerics with `backend`, its page size fitting the kernel."""
    multiple = BACKEND_SPECS[backend].page_size_multiple
    page = -(-base.page_size // multiple) * multiple
    return dataclasses.replace(base, numerics="fast", attention_backend=backend, page_size=page)


def check_kernel_backends(
    device: torch.device,
    *,
    exact_shape: ModelShape,
    exact_prompts: list[list[int]],
    exact_tokens: int,
    greedy: Greedy,
    bench_shape: ModelShape,
    bench_prompts: BenchPrompts,
    bench_engine: EngineConfig,
    release: Callable[[LoadedModel], None],
) -> dict:
    usable, skipped = runnable_kernels(device)
    result: dict = {"backends": {name: {"status": why} for name, why in skipped.items()}}
    result["checked"] = usable
    if not usable:  # nothing installed can run here: no promise to judge
        result["passed"] = True
        return result
    loaded = build_model(exact_shape, device=device, dtype=torch.bfloat16)
    exact_engine = EngineConfig(max_num_seqs=len(exact_prompts), kv_cache_memory=1024**3 // 4)
    reference = greedy(loaded, exact_prompts, exact_tokens, kernel_config(exact_engine, "sdpa"))
    for name in usable:
        mine = greedy(loaded, exact_prompts, exact_tokens, kernel_config(exact_engine, name))
        compared = sum(len(r) for r in reference)
        agree = sum(
            a == b for m, r in zip(mine, reference, strict=True) for a, b in zip(m, r, strict=True)
        )
        result["backends"][name] = {
            "status": "ran",
            "exact_model": exact_shape.name,
            "token_agreement_vs_sdpa": agree / compared,
            "exact_rows_vs_sdpa": sum(m == r for m, r in zip(mine, reference, strict=True)),
            "rows": len(reference),
        }
    release(loaded)
    loaded = build_model(bench_shape, device=device, dtype=torch.bfloat16)
    configs = {name: kernel_config(bench_engine, name) for name in ("sdpa", *usable)}
    warm = bench_prompts.head(8, 4)
    for config in configs.values():
        run_ours(loaded, warm, config, repeat=None)
    runs = {name: run_ours(loaded, bench_prompts, config, 0) for name, config in configs.items()}
    sdpa_rate = runs["sdpa"].generated_tokens_per_second
    result["bench"] = {
        "model": bench_shape.name,
        "prompts": bench_prompts.num_prompts,
        "max_tokens": bench_prompts.max_tokens,
        "generated_tokens_per_second": {
            name: run.generated_tokens_per_second for name, run in runs.items()
        },
        "engine_overhead": {name: run.engine_overhead for name, run in runs.items()},
    }
    for name in usable:
        result["backends"][name]["bench_ratio_vs_sdpa_fast"] = (
            runs[name].generated_tokens_per_second / sdpa_rate
        )
    release(loaded)
    result["passed"] = all(
        result["backends"][name]["token_agreement_vs_sdpa"] >= MIN_AGREEMENT for name in usable
    )
    return result
