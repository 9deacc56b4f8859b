"""One mixture-of-experts block, invariant experts against transformers' own, by row count.

Run: .venv/bin/python scripts/profile_moe_block.py [--rows 4,16,64,1024] [--repeat 3]

A Qwen3-MoE block at Qwen3-30B-A3B's shapes (hidden 2048, 128 experts of 768, top 8), random
weights, float32, one thread: the mean time of a forward of `[n, 2048]` rows with
transformers' default experts (`grouped_mm`) and with the engine's invariant experts and
router on the scheme probed for these shapes.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from astrai_batch.engine.numerics.blas_rows import probe_row_scheme
from astrai_batch.engine.runner.invariant_experts import expert_gemm_shapes, set_expert_tiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="4,16,64,1024")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = Qwen3MoeConfig(
        hidden_size=2048,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
    )
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.block = Qwen3MoeSparseMoeBlock(config)
    for param in holder.parameters():
        torch.nn.init.normal_(param, std=0.02)
    scheme = probe_row_scheme(expert_gemm_shapes(holder))
    print(f"scheme: {scheme.describe()}")

    def timed(rows: int) -> float:
        x = torch.randn(1, rows, config.hidden_size)
        with torch.inference_mode():
            holder.block(x)
            start = time.perf_counter()
            for _ in range(args.repeat):
                holder.block(x)
        return (time.perf_counter() - start) / args.repeat

    for rows in (int(n) for n in args.rows.split(",")):
        fast = timed(rows)
        set_expert_tiling(holder, True, scheme)
        invariant = timed(rows)
        set_expert_tiling(holder, False)
        print(
            f"{rows} rows: transformers {fast * 1000:.1f} ms, invariant {invariant * 1000:.1f} "
            f"ms, invariant / transformers {invariant / fast:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
