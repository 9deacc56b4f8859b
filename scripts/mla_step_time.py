"""Decode step time of multi-head latent attention: the engine's latent pages against the full
(expanded) per-head layout.

Run: .venv/bin/python scripts/mla_step_time.py [--contexts 512 2048] [--seqs 8] [--steps 8]
     [--layers 2] [--hidden 1024] [--heads 8] [--threads 2] [--fast-numerics]

The model: DeepSeek V3's attention shapes per head (`kv_lora_rank` 512, rope 64, no-rope 128,
value 128, `q_lora_rank` 1536) at a scaled-down width (`--hidden`, `--heads`, `--layers`; no
mixture of experts: every layer dense, intermediate 2816), vocabulary 1024, random weights,
float32, built in memory from a `DeepseekV3Config` (nothing downloaded).

For each context, `--seqs` sequences of that many random prompt tokens are prefilled, then the
engine's `step()` is timed over `--steps` decode-only steps (each: one token for every
sequence) after one untimed decode step. Two layouts, each its own engine over its own copy of
the model (same seed):

- "latent": the engine as it runs these models (`KVPool(latent=True)`: one 576-wide vector
  per token and layer, re-expanded by every layer's `kv_b_proj` each step, `latent_pages`);
- "full": the pool the engine held before latent pages (every head's key of 192 and its value
  zero-padded to 192), made by handing the engine a `LoadedModel` with `kv_latent=False` and
  per-head shapes; transformers then expands only each step's new tokens.

Prints one JSON object: the median and every step's seconds per layout and context, the ratio
latent / full of the medians, and whether both layouts gave the same greedy tokens. Figures
are wall time on whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import describe_model
from astrai_batch.engine.threads import set_cpu_threads

MLA = dict(
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
)
VOCAB = 1024
PAGE = 16


def tiny_tokenizer():
    """A word-level fast tokenizer: the engine wants one; prompts here are token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
        model_max_length=1 << 20,
    )


def build(args, context: int):
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    config = DeepseekV3Config(
        **MLA,
        hidden_size=args.hidden,
        intermediate_size=2816,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        num_hidden_layers=args.layers,
        first_k_dense_replace=args.layers,  # every layer dense: attention is what is measured
        n_routed_experts=0,
        vocab_size=VOCAB,
        max_position_embeddings=context + args.steps + 16,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config.architectures = ["DeepseekV3ForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    model.requires_grad_(False)
    return describe_model(model, tiny_tokenizer(), name="deepseek-v3-shape", source="random")


def full_layout(loaded):
    """The same model with per-head pages: every head's key (no-rope + rope) per token."""
    config = loaded.model.config
    key = int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
    heads = int(config.num_attention_heads)
    return dataclasses.replace(loaded, kv_latent=False, num_kv_heads=heads, head_dim=key)


def time_steps(loaded, args, context: int) -> tuple[list[float], list[list[int]]]:
    """The timed steps' seconds and every sequence's greedy tokens."""
    new_tokens = args.steps + 2  # the first token (prefill), one untimed step, the timed ones
    pages = args.seqs * (-(-(context + new_tokens) // PAGE)) + 4
    config = EngineConfig(
        page_size=PAGE,
        num_pages=pages,
        max_num_seqs=args.seqs,
        max_num_batched_tokens=2048,
        numerics="fast" if args.fast_numerics else "invariant",
    )
    core = EngineCore(loaded, config)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    gen = torch.Generator().manual_seed(1)
    for i in range(args.seqs):
        prompt = torch.randint(0, VOCAB, (context,), generator=gen).tolist()
        assert core.add_request(GenerationRequest(i, prompt, params)) == []
    assert core.pool.latent == loaded.kv_latent
    tokens = {}

    def step() -> None:
        for result in core.step():
            tokens[result.request_id] = list(result.token_ids)

    while core.stats().prefill_tokens < args.seqs * context:
        step()
    step()  # every sequence's first decode step: untimed
    seconds = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    assert core.num_unfinished == 0 and core.stats().decode_tokens == args.seqs * new_tokens
    core.close()
    return seconds, [tokens[i] for i in range(args.seqs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fast-numerics", action="store_true")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    report = {
        "model": {**MLA, "hidden": args.hidden, "heads": args.heads, "layers": args.layers},
        "seqs": args.seqs,
        "numerics": "fast" if args.fast_numerics else "invariant",
        "threads": args.threads,
        "contexts": {},
    }
    for context in args.contexts:
        row, outputs = {}, {}
        for layout in ("latent", "full"):
            loaded = build(args, context)  # a fresh model: the latent engine hooks its layers
            if layout == "full":
                loaded = full_layout(loaded)
            seconds, outputs[layout] = time_steps(loaded, args, context)
            row[layout] = {
                "median_s": round(statistics.median(seconds), 5),
                "steps_s": [round(s, 5) for s in seconds],
            }
        row["latent_over_full"] = round(row["latent"]["median_s"] / row["full"]["median_s"], 2)
        row["same_tokens"] = outputs["latent"] == outputs["full"]
        report["contexts"][str(context)] = row
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
