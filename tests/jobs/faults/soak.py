"""The soak: draw configurations from consecutive seeds and run each with its faults until
time is up (`scripts/soak --minutes N`); or one configuration again (`--seed N`).

Prints one line per configuration (its seed, what was drawn, attempts, kills), the exact
command that reproduces any mismatch, and the totals: configurations run, kills injected,
mismatches. Exits 1 when any configuration mismatched.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
from jobs.faults.matrix import draw
from jobs.faults.runner import Place, run_matrix
from s3_server import s3_server


@contextlib.contextmanager
def ray_cluster() -> Iterator[str]:
    """A local Ray of 2 CPUs for every Ray configuration (a driver killed by a fault takes
    only its own job's workers with it)."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, help="run this one configuration")
    parser.add_argument("--first-seed", type=int, help="default: drawn from the clock")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-s3", action="store_true")
    options = parser.parse_args(argv)
    import logging

    from conftest import _save_tiny_model
    from transformers.utils import logging as transformers_logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    transformers_logging.disable_progress_bar()

    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="astrai-soak-")))
        model = _save_tiny_model(root / "model", "llama")
        fs, query = stack.enter_context(s3_server()) if not options.no_s3 else (None, None)
        lazy: dict[str, str] = {}

        def ray_address() -> str:
            if "address" not in lazy:
                lazy["address"] = stack.enter_context(ray_cluster())
            return lazy["address"]

        if options.seed is not None:
            seeds: Iterator[int] = iter([options.seed])
        else:
            first = options.first_seed
            if first is None:
                first = random.SystemRandom().randrange(1, 10**9)
            seeds = iter(range(first, first + 10**9))
            print(f"soak: first seed {first}, {options.minutes:g} minutes", flush=True)
        deadline = time.monotonic() + options.minutes * 60
        runs = kills = mismatches = refused = 0
        foreign: dict[str, int] = {}
        for seed in seeds:
            if options.seed is None and time.monotonic() > deadline:
                break
            matrix = draw(seed, allow_ray=not options.no_ray, allow_s3=fs is not None)
            work = root / f"seed-{seed}"
            if matrix.storage == "s3":
                place = Place(fs, f"bucket/seed-{seed}", query)
            else:
                (work / "job").mkdir(parents=True)
                place = Place(pafs.LocalFileSystem(), str(work / "job"))
            address = ray_address() if matrix.uses_ray else None
            outcome = run_matrix(matrix, model, work, place, address)
            runs += 1
            kills += outcome.kills
            refused += outcome.refused_switches
            print(outcome.line(), flush=True)
            for line in outcome.foreign_stderr:
                key = line.split("]", 1)[-1].strip()[:160]
                foreign[key] = foreign.get(key, 0) + 1
            if outcome.mismatch is not None:
                mismatches += 1
                print(f"  reproduce: scripts/soak --seed {seed}", flush=True)
                for entry in outcome.log:
                    print(f"    {entry}", flush=True)
        print(
            f"soak: configurations run {runs}, kills injected {kills}, refused executor "
            f"switches {refused}, mismatches {mismatches}",
            flush=True,
        )
        for line, count in sorted(foreign.items()):
            print(f"soak: stderr line not ours, {count} times: {line}", flush=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
