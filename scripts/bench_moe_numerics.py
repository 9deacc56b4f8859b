"""The cost of batch-invariant numerics on a mixture-of-experts model, invariant and fast
alternated.

Run: .venv/bin/python scripts/bench_moe_numerics.py [--layers 2] [--repeat 3]
     [--num-system-prompts 2] [--questions-per-prompt 8] [--max-tokens 16] [--threads 1]

The model: Qwen3-30B-A3B's layer shapes (hidden 2048; 128 experts of intermediate size 768,
8 routed per token, normalized; 32 query and 4 key/value heads of 128) with `--layers` layers
instead of 48, random weights, SmolLM2's tokenizer and vocabulary (49,152), float32, built in
memory (nothing downloaded). Prompts: the bench workloads'. For each workload the two modes
run alternately after one warm-up each; the script prints each run's wall time and the median
ratio invariant / fast of the rounds.
"""

from __future__ import annotations

import argparse

import torch

from astrai_batch.bench.numerics_pairs import alternate_numerics, print_ratio, workload_config
from astrai_batch.bench.prompts import load_prompts
from astrai_batch.engine.model.loader import describe_model, load_tokenizer
from astrai_batch.engine.threads import set_cpu_threads

QWEN3_30B_A3B = dict(
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def build(layers: int):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    tokenizer, _ = load_tokenizer("smollm2-135m")
    config = Qwen3MoeConfig(
        **QWEN3_30B_A3B,
        num_hidden_layers=layers,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.02,
    )
    config.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    model.requires_grad_(False)
    name = f"qwen3-30b-a3b-shape-{layers}-layers"
    return describe_model(model, tokenizer, name=name, source="random weights")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--num-system-prompts", type=int, default=2)
    parser.add_argument("--questions-per-prompt", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--system-prompt-words", type=int, default=None)
    parser.add_argument("--workloads", default="shared-prefix,unique")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    loaded = build(args.layers)
    for workload in args.workloads.split(","):
        config = workload_config("smollm2-135m", workload, args)
        prompts = load_prompts(config, loaded.tokenizer, loaded.name)
        walls = alternate_numerics(
            loaded, prompts, workload, repeat=args.repeat, warmup=prompts.head(2, 2)
        )
        print_ratio(workload, prompts, walls)


if __name__ == "__main__":
    main()
