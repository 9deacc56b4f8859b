"""Scoring benchmark: prefill computed vs ideal, and pairs/s against a transformers peer.

    PYTHONPATH=. python scripts/bench_score.py [--model smollm2-135m] [--shots 3]
        [--questions 16] [--threads 2] [--repeats 3]

Prints medians over `--repeats` runs of both, alternated, and the ratios within this
invocation (the machine is shared: compare ratios, not absolute figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from astrai_batch.bench.score_bench import ScoreWorkload, ideal_tokens, run_ours, run_peer
from astrai_batch.engine import EngineConfig
from astrai_batch.engine.model.loader import load_model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--shot-tokens", type=int, default=400)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--peer-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fast-numerics", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workload = ScoreWorkload(
        shots=args.shots, questions=args.questions, shot_tokens=args.shot_tokens
    )
    ours_model = load_model(args.model)
    peer_model = load_model(args.model).model.eval()
    rows = workload.rows(ours_model.model.config.vocab_size)
    pairs = sum(len(c) for _, c in rows)
    ideal = ideal_tokens(rows)
    config = EngineConfig(
        page_size=args.page_size,
        kv_cache_memory=512 * 2**20,
        numerics="fast" if args.fast_numerics else "invariant",
    )
    ours_s, peer_s = [], []
    for _ in range(args.repeats):
        ours, stats, seconds = run_ours(ours_model, rows, config)
        ours_s.append(seconds)
        peer, seconds = run_peer(peer_model, rows, args.peer_batch)
        peer_s.append(seconds)
    diff = max(
        abs(a - b) for r, p in zip(ours, peer, strict=True) for a, b in zip(r, p, strict=True)
    )
    ours_med, peer_med = statistics.median(ours_s), statistics.median(peer_s)
    print(f"command: {' '.join(sys.argv)}")
    print(f"rows {len(rows)}, pairs {pairs}, workload {workload}")
    print(
        f"prefill computed {stats.prefill_tokens} tokens, ideal {ideal}, "
        f"ratio {stats.prefill_tokens / ideal:.3f}"
    )
    print(f"ours: median {ours_med:.2f} s ({pairs / ours_med:.1f} pairs/s) over {ours_s}")
    print(f"peer: median {peer_med:.2f} s ({pairs / peer_med:.1f} pairs/s) over {peer_s}")
    print(f"speedup {peer_med / ours_med:.2f}x; largest |loglikelihood difference| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
