"""Throughput with per-row LoRA adapters against the same rows on the base model alone.

Run: .venv/bin/python scripts/bench_lora.py [--model smollm2-135m] [--pairs 3]

The shared-prefix workload (chat rows: a few system prompts, many questions each), greedy.
The LoRA run installs 4 adapters of rank 16 on q/k/v/o and the MLP projections (random
weights, written as PEFT adapter directories) and gives row i adapter i % 4; the base run
is the same rows with no adapter installed. `--assign by-prompt` gives instead the rows of
system prompt k adapter k % N: every adapter still runs in every batch, but no system prompt
is prefilled once per adapter (what interleaving costs in prefill, since adapters never
share cached pages). Runs alternate (base, lora) `--pairs` times;
printed: each run's generated tokens per second and the median ratio lora / base
(target >= 0.8), with the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from astrai_batch.bench.workloads import WorkloadSpec, build_workload
from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, load_model
from astrai_batch.engine.async_engine import generate_sync
from astrai_batch.engine.lora.adapter_files import read_adapters
from astrai_batch.engine.lora.bank import install_adapters, remove_adapters

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGET_RATIO = 0.8


def write_adapter(model: torch.nn.Module, path: Path, rank: int, seed: int) -> None:
    """A PEFT-format LoRA adapter with random A and B on every target projection."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS and isinstance(module, torch.nn.Linear):
            a = torch.randn(rank, module.in_features, generator=generator) * 0.02
            b = torch.randn(module.out_features, rank, generator=generator) * 0.02
            tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    path.mkdir(parents=True)
    save_file(tensors, path / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(TARGETS),
        "bias": "none",
    }
    (path / "adapter_config.json").write_text(json.dumps(config))


def timed(loaded, requests, config) -> tuple[float, int]:
    """Generated tokens per second, and the tokens the run put through the model."""
    started = time.perf_counter()
    results, stats = generate_sync(loaded, requests, config)
    seconds = time.perf_counter() - started
    generated = sum(len(r.token_ids) for r in results)
    return generated / seconds, stats.prefill_tokens + stats.decode_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--assign", choices=("interleaved", "by-prompt"), default="interleaved")
    args = parser.parse_args()

    loaded = load_model(args.model)
    spec = WorkloadSpec(
        "shared-prefix",
        num_system_prompts=args.system_prompts,
        questions_per_prompt=args.questions,
        max_tokens=args.max_tokens,
    )
    rows = build_workload(spec)
    tokenizer = loaded.tokenizer
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                list(row.messages), add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for row in rows
    ]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    names = [f"lora{k}" for k in range(args.adapters)]
    base_requests = [GenerationRequest(i, p, params) for i, p in enumerate(prompts)]
    systems = list(dict.fromkeys(row.messages[0]["content"] for row in rows))

    def adapter_of(i: int) -> str:
        if args.assign == "by-prompt":  # the adapter follows the row's system prompt
            return names[systems.index(rows[i].messages[0]["content"]) % len(names)]
        return names[i % len(names)]

    lora_requests = [
        GenerationRequest(i, p, params, adapter=adapter_of(i)) for i, p in enumerate(prompts)
    ]
    config = EngineConfig(page_size=16, kv_cache_memory=1 << 30)
    with tempfile.TemporaryDirectory() as root:
        for k, name in enumerate(names):
            write_adapter(loaded.model, Path(root) / name, args.rank, seed=k)
        adapters = read_adapters([(n, str(Path(root) / n)) for n in names], max_rank=args.rank)
    base_rates, lora_rates, ratios = [], [], []
    for _ in range(args.pairs):
        base, base_work = timed(loaded, base_requests, config)
        install_adapters(loaded.model, adapters, max_rank=args.rank)
        lora, lora_work = timed(loaded, lora_requests, config)
        remove_adapters(loaded.model)
        base_rates.append(base)
        lora_rates.append(lora)
        ratios.append(lora / base)
        print(f"base {base:8.1f} tok/s   lora {lora:8.1f} tok/s   ratio {lora / base:.3f}")
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
    print(
        f"{len(rows)} rows, {args.adapters} adapters of rank {args.rank} mixed evenly "
        f"({args.assign}): "
        f"median base {statistics.median(base_rates):.1f} tok/s, "
        f"lora {statistics.median(lora_rates):.1f} tok/s, "
        f"ratio {ratio:.3f} (target >= {TARGET_RATIO}: {verdict})"
    )
    # Adapters never share cached pages: what the LoRA run must compute beyond the base run's
    # bounds the ratio even with free deltas.
    print(
        f"tokens through the model: base {base_work}, lora {lora_work}; "
        f"work bound on the ratio {base_work / lora_work:.3f}"
    )
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))


if __name__ == "__main__":
    main()
