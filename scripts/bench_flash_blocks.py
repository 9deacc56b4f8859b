"""One decode step's attention on the issue-33 workload's shape: the invariant flash path in
key blocks of each length, beside the fast path's cascade, alternated in one process.

Run: .venv/bin/python scripts/bench_flash_blocks.py [--threads 2] [--dtype bfloat16]
     [--repeat 5] [--blocks 64,128,256,512] [--prefix-pages 18] [--first-position 300]

64 decodes over 8 system prompts of 288 tokens (18 shared pages of 16 tokens; --prefix-pages)
at positions 300..363 (--first-position), SmolLM2-135M's attention shapes (9 query heads, 3 KV
heads, head size 64). Each
variant plans the step and attends it 30 times (one per layer); the median over rounds is
printed per variant, with the keys each reads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from astrai_batch.engine.attention.cascade import cascade_attention, partition_rows
from astrai_batch.engine.attention.cascade_plan import plan_cascade
from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention
from astrai_batch.engine.attention.flash_probe import invariant_tails
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.step_arrays import StepArrays

Q_HEADS, KV_HEADS, DIM, PAGE, LAYERS = 9, 3, 64, 16, 30
GROUPS, PER_GROUP = 8, 8


def workload(dtype, prefix_pages: int = 18, first_position: int = 300):
    if first_position < prefix_pages * PAGE:
        raise SystemExit("--first-position must be past the shared prefix")
    rng = np.random.default_rng(0)
    n = GROUPS * PER_GROUP
    positions = first_position + rng.permutation(n)
    pages_each = (positions // PAGE + 1).max()
    tables = np.zeros((n, pages_each), dtype=np.int64)
    free = iter(range(1, 100_000))
    for g in range(GROUPS):
        prefix = [next(free) for _ in range(prefix_pages)]
        for i in range(g * PER_GROUP, (g + 1) * PER_GROUP):
            own = [next(free) for _ in range(pages_each - prefix_pages)]
            tables[i] = prefix + own
    slots = (int(tables.max()) + 1) * PAGE
    keys = torch.randn(slots, KV_HEADS, DIM).to(dtype)
    values = torch.randn(slots, KV_HEADS, DIM).to(dtype)
    q = torch.randn(n, Q_HEADS, DIM).to(dtype)
    step = StepArrays(
        *(np.zeros(n, dtype=np.int64),) * 4,
        token_start=np.arange(n),
        num_tokens=np.ones(n, dtype=np.int64),
        context_start=positions,
        page_tables=tables,
        decodes=np.arange(n),
        longest_context=int(positions.max()) + 1,
    )
    return step, q, keys, values


def invariant(block, tails, step, q, keys, values, dtype):
    staging = HostStaging("cpu")
    rules = FlashRules(Q_HEADS // KV_HEADS, tails, block)
    calls, merge = plan_flash_step(step, PAGE, rules, dtype, staging)
    batch = FlashBlockBatch(
        [keys],
        [values],
        PAGE,
        staging.array(step.write_slots),
        0,
        calls,
        merge,
        PageGatherer(),
        row_memo={},  # as the engine's step keeps its row indexes for its layers
    )
    for _ in range(LAYERS):
        flash_block_attention(q, keys, values, batch, DIM**-0.5)
    return sum(c.elements * c.keys for c in calls)


def fast(step, q, keys, values):
    staging = HostStaging("cpu")
    lengths = step.context_start + 1
    part = partition_rows(step.page_tables, lengths, PAGE)
    tables = [list(t) for t in step.page_tables]
    batch = plan_cascade(
        part.groups, list(range(len(lengths))), tables, lengths.tolist(), PAGE, staging
    )
    n = q.shape[0]
    qc = q.view(n, KV_HEADS, Q_HEADS // KV_HEADS, DIM)
    for _ in range(LAYERS):
        cascade_attention(qc, keys, values, batch, PAGE, DIM**-0.5, PageGatherer())
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--blocks", default="64,128,256,512")
    parser.add_argument("--prefix-pages", type=int, default=18)
    parser.add_argument("--first-position", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    step, q, keys, values = workload(dtype, args.prefix_pages, args.first_position)
    variants = {"fast cascade": lambda: fast(step, q, keys, values)}
    for block in (int(b) for b in args.blocks.split(",")):
        tails = invariant_tails(DIM, KV_HEADS, dtype, block)
        if tails is None:
            print(f"{block}-key blocks: not invariant here, skipped")
            continue
        variants[f"invariant, {block}-key blocks"] = lambda b=block, t=tails: invariant(
            b, t, step, q, keys, values, dtype
        )
    walls: dict[str, list[float]] = {name: [] for name in variants}
    read = {}
    with torch.inference_mode():
        for name, run in variants.items():  # warm-up
            read[name] = run()
        for _ in range(args.repeat):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                walls[name].append(time.perf_counter() - start)
    base = statistics.median(walls["fast cascade"])
    for name, times in walls.items():
        median = statistics.median(times)
        keys_read = "" if read[name] is None else f", {read[name]} keys read per KV head"
        print(
            f"{args.dtype}, {torch.get_num_threads()} threads, prefix "
            f"{args.prefix_pages * PAGE}, {name}: {median * 1e3:.1f} ms "
            f"for {LAYERS} layers ({median / base:.2f}x the fast cascade){keys_read}",
            flush=True,
        )


if __name__ == "__main__":
    main()
