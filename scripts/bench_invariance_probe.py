#!/usr/bin/env python3
"""What the start-up invariance probe costs (`engine/numerics/invariance_probe.py`).

Usage: scripts/bench_invariance_probe.py [--model tiny|smollm2-135m|PATH] [--repeat 3]

Prints the median wall and CPU time of `check_invariance_at_start` (after one warm-up) with the
command that produced it, and its verdict (a refusal costs as much as a pass: every run is
made before any comparison); `tiny` is the random-weight tiny Llama of the device check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # our tree, not installed


def main(argv: list[str]) -> int:
    from astrai_batch.bench.random_models import TINY, build_model
    from astrai_batch.engine.config import EngineConfig
    from astrai_batch.engine.core import EngineCore
    from astrai_batch.engine.model.loader import load_model
    from astrai_batch.engine.numerics.invariance_probe import check_invariance_at_start
    from astrai_batch.errors import NumericsUnavailableError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    loaded = build_model(TINY) if args.model == "tiny" else load_model(args.model)
    config = EngineConfig()
    times, cpu, verdict = [], [], "passed"
    for run in range(args.repeat + 1):  # the first is a warm-up: first calls allocate
        began, began_cpu = time.perf_counter(), time.process_time()
        try:
            check_invariance_at_start(
                loaded, config, lambda c: EngineCore(loaded, c, invariance_probe=False)
            )
        except NumericsUnavailableError as exc:
            verdict = f"refused: {exc}"
        wall, busy = time.perf_counter() - began, time.process_time() - began_cpu
        print(f"run {run}: {1000 * wall:.1f} ms wall, {1000 * busy:.1f} ms CPU", flush=True)
        if run:
            times.append(wall)
            cpu.append(busy)
    command = " ".join(["scripts/bench_invariance_probe.py", *argv])
    wall, busy = 1000 * statistics.median(times), 1000 * statistics.median(cpu)
    print(
        f"{command}: probe median {wall:.1f} ms wall, {busy:.1f} ms CPU over {args.repeat}; "
        f"{verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
