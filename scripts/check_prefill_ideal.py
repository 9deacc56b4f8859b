"""Prefill tokens the engine computes vs the ideal of the shared-prefix workload (SmolLM2).

The 256 prompts go to the engine in their shuffled file order, so any regrouping is the
scheduler's own. Run: .venv/bin/python scripts/check_prefill_ideal.py
"""

from __future__ import annotations

import time

from astrai_batch.bench.workloads import WorkloadSpec, build_workload
from astrai_batch.engine import (
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    generate_sync,
    load_model,
)
from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats


def main() -> None:
    loaded = load_model("smollm2-135m")
    tokenizer = loaded.tokenizer
    rows = build_workload(WorkloadSpec(name="shared-prefix"))

    def encode(row):
        messages = list(row.messages)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompts = [encode(row) for row in rows]
    ideal = ideal_prefix_stats(prompts, page_size=16)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    started = time.perf_counter()
    _, stats = generate_sync(loaded, requests, EngineConfig())
    print(
        f"rows {len(rows)}, prompt tokens {sum(map(len, prompts))}, "
        f"ideal prefill {ideal.unique_tokens}, computed {stats.prefill_tokens} "
        f"({stats.prefill_tokens / ideal.unique_tokens:.3f}x), "
        f"cache hit tokens {stats.cache.hit_tokens}, wall {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
