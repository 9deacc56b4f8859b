"""Structured-output overhead: a JSON extraction workload run constrained and unconstrained.

Run: .venv/bin/python scripts/bench_constraints.py [--rows 256] [--pairs 2] [--threads 1]

256 rows share one system prompt ("extract the person as JSON") and one schema; SmolLM2-135M,
greedy. A first constrained run (warm-up) fixes each row's completion length L_i. Then
unconstrained runs (max_tokens = L_i, ignore_eos) and constrained runs (max_tokens = the
warm-up's) run in pairs whose order alternates (U C, then C U, ...): both generate exactly the
same number of tokens per row, so their steps have the same batch sizes and the wall-time
ratio isolates what the constraint costs (mask fill, mask application, matcher updates).
Prints the median throughput of each, their ratio (target >= 0.9) and the share of
constrained step time spent filling masks (in the worker thread, beside the forward) and
waiting for them after the forward.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from astrai_batch.engine import EngineConfig, GenerationRequest, SamplingParams, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.sampling.constraints import Constraint
from astrai_batch.engine.threads import set_cpu_threads

SYSTEM = (
    "You extract structured data. Read the text and answer with one JSON object holding the "
    "person's name, age, city and occupation. Use null for nothing; no extra keys."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
    },
    "required": ["name", "age", "city", "occupation"],
}
FIRST = ["Maria", "John", "Aiko", "Pierre", "Fatima", "Lars", "Chen", "Ana", "Omar", "Greta"]
LAST = ["Silva", "Smith", "Tanaka", "Dupont", "Haddad", "Berg", "Wei", "Costa", "Nasser", "Vogel"]
CITIES = ["Lisbon", "Leeds", "Osaka", "Lyon", "Beirut", "Bergen", "Xi'an", "Porto", "Cairo", "Graz"]
JOBS = ["nurse", "teacher", "welder", "pilot", "baker", "chemist", "farmer", "lawyer", "architect"]
MAX_TOKENS = 64


def texts(rows: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        out.append(
            f"{name}, {rng.randint(18, 90)}, works as a {rng.choice(JOBS)} in "
            f"{rng.choice(CITIES)} and has done so for {rng.randint(1, 30)} years."
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=2, help="unconstrained/constrained pairs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    loaded = load_model("smollm2-135m")
    tokenizer = loaded.tokenizer
    prompts = []
    for text in texts(args.rows):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(chat, add_special_tokens=False)["input_ids"])
    config = EngineConfig()
    constraint = Constraint.json_schema(SCHEMA)
    constrained = [
        GenerationRequest(i, p, SamplingParams(max_tokens=MAX_TOKENS, constraint=constraint))
        for i, p in enumerate(prompts)
    ]
    warm, _ = generate_sync(loaded, constrained, config)
    lengths = [r.completion_tokens for r in warm]
    valid = sum(1 for r in warm if r.finish_reason == "stop" and _parses(r.text))
    free = [
        GenerationRequest(i, p, SamplingParams(max_tokens=n, ignore_eos=True))
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    runs: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
    fill_shares, wait_shares = [], []
    sides = (("unconstrained", free), ("constrained", constrained))
    for pair in range(args.pairs):
        # The order alternates (U C, C U, U C, ...), so neither side always runs first (in a
        # colder cache, or after the other's garbage).
        for name, requests in sides if pair % 2 == 0 else sides[::-1]:
            started = time.perf_counter()
            results, stats = generate_sync(loaded, requests, config)
            wall = time.perf_counter() - started
            tokens = sum(r.completion_tokens for r in results)
            if tokens != sum(lengths):
                raise RuntimeError(f"{name} generated {tokens} tokens, expected {sum(lengths)}")
            runs[name].append(tokens / wall)
            if name == "constrained":
                fill_shares.append(stats.mask_fill_seconds / stats.busy_seconds)
                wait_shares.append(stats.mask_wait_seconds / stats.busy_seconds)
    free_rate = statistics.median(runs["unconstrained"])
    constrained_rate = statistics.median(runs["constrained"])
    report = {
        "rows": args.rows,
        "completion_tokens": sum(lengths),
        "valid_json_rows": valid,
        "unconstrained_tokens_per_second": round(free_rate, 1),
        "constrained_tokens_per_second": round(constrained_rate, 1),
        "ratio": round(constrained_rate / free_rate, 3),
        # each pair's constrained run against its unconstrained run
        "pair_ratios": [
            round(c / u, 3) for u, c in zip(runs["unconstrained"], runs["constrained"], strict=True)
        ],
        "mask_fill_share_of_step_time": round(statistics.median(fill_shares), 4),
        "mask_wait_share_of_step_time": round(statistics.median(wait_shares), 4),
        "runs": {name: [round(r, 1) for r in rates] for name, rates in runs.items()},
    }
    print(json.dumps(report, indent=2))


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


if __name__ == "__main__":
    main()
