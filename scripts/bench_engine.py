"""The engine's speed table (issue 3): ours against transformers on the shared-prefix workload.

Run: .venv/bin/python scripts/bench_engine.py [--repeat 3] [--out results.parquet] [...]

The same SmolLM2-135M weights (float32, CPU), 256 prompts (8 system prompts of about 250
tokens, each shared by 32 questions, shuffled), 64 new tokens each, greedy with end of
sequence ignored, through our engine, transformers `generate` (sorted by length, left-padded
batches of the fastest of 16/32/64/128 on a probe) and transformers `generate_batch`,
alternating, in one process. It is `astrai-batch bench` with these settings; any further
bench option given here is passed on (and wins).

Targets on a 2-core CPU: generated tokens/s at least 5x `generate` and 10x `generate_batch`;
prefill computed at most 1.05x the ideal; engine overhead at most 15% of wall time.
A full run takes tens of minutes on two cores, nearly all of it in the two peers.
"""

from __future__ import annotations

import sys

from astrai_batch.cli import main

ISSUE_SETTINGS = (
    "--model",
    "smollm2-135m",
    "--dtype",
    "float32",
    "--workload",
    "shared-prefix",
    "--num-system-prompts",
    "8",
    "--questions-per-prompt",
    "32",
    "--max-tokens",
    "64",
    "--peers",
    "hf-generate,hf-generate-batch",
    "--repeat",
    "1",
)


if __name__ == "__main__":
    # click keeps the last value of an option given twice, so the caller's flags win.
    main(["bench", *ISSUE_SETTINGS, *sys.argv[1:]], prog_name="bench_engine.py")
