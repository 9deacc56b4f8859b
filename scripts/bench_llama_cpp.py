"""Issue 33's comparison: our engine in three configurations against llama.cpp, in one process.

Run: PYTHONPATH=/path/to/llama-cpp-python:. .venv/bin/python scripts/bench_llama_cpp.py
     [--repeat 2] [--num-system-prompts 8] [--questions-per-prompt 8] [--max-tokens 64]
     [--threads 2] [--no-throughput] [--no-chats]

SmolLM2-135M from its packaged GGUF (Q4_1): our engine dequantizes it; llama.cpp
(llama-cpp-python, the `llama-cpp` extra, `bench/llama_cpp_peer`) runs it as it is, in a process
of its own (`bench/llama_cpp_process`: in ours, it slowed our later runs). The
shared-prefix workload, greedy, end of sequence ignored; after one warm-up of each, every
round runs ours with the default options (`--dtype auto`: bfloat16 where the CPU has native
bf16 dot products; invariant numerics), ours `--dtype float32`, ours `--fast-numerics` (the
default dtype) and llama.cpp, round 1 in that order, each later round's order rotated by one
(`bench/numerics_pairs.round_order`: --repeat 4 puts each system once in each place). Printed
per run: wall, generated tokens/s,
our runs' roofline (`bench/roofline`: weight-GEMM FLOPs against the GEMM peak of that dtype,
measured at the start and after every round, the highest so far) and each system's greedy
agreement with the float32 run of the same round; then medians, per-round ratios and each of
our systems' wall over its GEMM floor at the highest peak measured in the whole bench.

Then (unless --no-chats) greedy agreement on real chats: `CHATS` (everyday questions through
SmolLM2's chat template), float32 as the reference (transformers-exact) and compared up to
and including its first end-of-sequence token (what a user reads), beside the default dtype
and llama.cpp Q4_1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.greedy_agreement import agreement
from astrai_batch.bench.llama_cpp_peer import gguf_path
from astrai_batch.bench.llama_cpp_process import LlamaCppProcess
from astrai_batch.bench.numerics_pairs import round_order
from astrai_batch.bench.ours import run_ours
from astrai_batch.bench.prompts import BenchPrompts, load_prompts
from astrai_batch.bench.roofline import GemmPeak, Roofline, roofline
from astrai_batch.engine import EngineConfig, keep_freed_memory
from astrai_batch.engine.device_choice import resolve_dtype_name
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.threads import set_cpu_threads

MODEL = "smollm2-135m"
CHATS = (
    "What is the capital of France?",
    "How do I boil an egg?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about the sea.",
    "What are three tips for staying focused while studying?",
    "Why is the sky blue?",
    "Give me a short recipe for pancakes.",
    "What is the difference between a virus and a bacterium?",
    "How many continents are there, and which is the largest?",
    "Suggest a name for a small bakery.",
    "What does a CPU do in a computer?",
    "How can I improve my sleep?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is 15 multiplied by 12?",
    "Translate 'good morning' into Spanish.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a black hole is.",
    "Write a polite email declining a meeting invitation.",
    "What are the benefits of drinking water?",
    "How does a rainbow form?",
    "Tell me a fun fact about octopuses.",
    "What is machine learning?",
    "How do I start learning to play the guitar?",
    "Why do leaves change color in autumn?",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--num-system-prompts", type=int, default=8)
    parser.add_argument("--questions-per-prompt", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--chat-max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-chats", action="store_true")
    args = parser.parse_args()
    threads = set_cpu_threads(args.threads)
    keep_freed_memory()  # as the run and bench commands do (malloc_tuning)
    default_dtype = resolve_dtype_name("auto", "cpu")
    models = {default_dtype: load_model(MODEL, dtype=default_dtype)}
    models.setdefault("float32", load_model(MODEL, dtype="float32"))
    print(f"--dtype auto on this CPU: {default_dtype}; {threads} threads", flush=True)
    config = BenchConfig(
        model=MODEL,
        workload="shared-prefix",
        num_system_prompts=args.num_system_prompts,
        questions_per_prompt=args.questions_per_prompt,
        max_tokens=args.max_tokens,
    )
    prompts = load_prompts(config, models["float32"].tokenizer, models["float32"].name)
    chats = None if args.no_chats else _chat_prompts(models["float32"], args.chat_max_tokens)
    if not args.no_throughput:
        peer = LlamaCppProcess(gguf_path(MODEL), prompts, threads)
        print(f"llama-cpp: {json.dumps(peer.config())}", flush=True)
        try:
            _throughput(models, default_dtype, prompts, peer, args.repeat)
        finally:
            peer.close()
    if chats is not None:
        peer = LlamaCppProcess(gguf_path(MODEL), chats, threads)  # its context sized for them
        try:
            _chat_agreement(models, default_dtype, chats, peer)
        finally:
            peer.close()


def _throughput(models, default_dtype, prompts: BenchPrompts, peer, repeat: int) -> None:
    peaks = {dtype: GemmPeak(loaded.model) for dtype, loaded in models.items()}
    try:
        _rounds(models, default_dtype, prompts, peer, repeat, peaks)
    finally:
        for peak in peaks.values():
            peak.close()


def _rounds(models, default_dtype, prompts: BenchPrompts, peer, repeat: int, peaks) -> None:
    for dtype, peak in peaks.items():
        peak.measure()
        print(f"GEMM peak {dtype}: {peak.describe()}", flush=True)
    print(
        f"workload: {prompts.num_prompts} prompts, {prompts.prompt_tokens:,} prompt tokens "
        f"(prefix tree {prompts.ideal.unique_tokens:,}), {prompts.max_tokens} new tokens each",
        flush=True,
    )
    invariant = EngineConfig()
    systems = {
        f"ours default ({default_dtype})": (default_dtype, invariant),
        "ours --dtype float32": ("float32", invariant),
        f"ours --fast-numerics ({default_dtype})": (
            default_dtype,
            replace(invariant, numerics="fast"),
        ),
    }
    warmup = prompts.head(4, 4)
    for dtype, engine in systems.values():
        run_ours(models[dtype], warmup, engine, None)
    peer.run(warmup, None)
    walls: dict[str, list[float]] = {name: [] for name in (*systems, "llama-cpp")}
    rooflines: dict[str, list[Roofline]] = {name: [] for name in systems}
    for round_ in range(repeat):
        runs = {}
        for name in round_order(tuple(walls), round_):
            if name == "llama-cpp":
                runs[name] = peer.run(prompts, round_)
                print(f"round {round_ + 1} llama-cpp: {_rate(runs[name])}", flush=True)
                continue
            dtype, engine = systems[name]
            run = run_ours(models[dtype], prompts, engine, round_)
            line = roofline(models[dtype].model, run, peaks[dtype].best, prompts.num_prompts)
            rooflines[name].append(line)
            runs[name] = run
            print(f"round {round_ + 1} {name}: {_rate(run)}; {line.line()}", flush=True)
        reference = runs["ours --dtype float32"].token_ids
        for name in walls:
            run = runs[name]
            walls[name].append(run.wall_seconds)
            if run.token_ids != reference:
                figures = _agree(prompts.prompt_token_ids, run.token_ids, reference)
                print(f"  {name} vs float32: {figures}", flush=True)
        for peak in peaks.values():
            peak.measure()
    llama = walls["llama-cpp"]
    for name, seconds in walls.items():
        ratios = [theirs / ours for ours, theirs in zip(seconds, llama, strict=True)]
        print(
            f"{name}: median wall {statistics.median(seconds):.2f} s "
            f"(rounds {', '.join(f'{s:.2f}' for s in seconds)}); tokens/s over llama.cpp "
            f"{statistics.median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})",
            flush=True,
        )
    default, _, fast, _ = walls.values()
    ratios = [d / f for d, f in zip(default, fast, strict=True)]
    print(
        f"invariant/fast ({default_dtype}): {statistics.median(ratios):.3f} "
        f"(rounds {', '.join(f'{r:.3f}' for r in ratios)})",
        flush=True,
    )
    for name, (dtype, _) in systems.items():
        peak = peaks[dtype]
        at_best = [replace(line, peak_flops_per_second=peak.best) for line in rooflines[name]]
        over = [line.wall_seconds / line.floor_seconds for line in at_best]
        print(
            f"{name}: wall over its GEMM floor {statistics.median(over):.2f}x (rounds "
            f"{', '.join(f'{r:.2f}' for r in over)}) at the peak {peak.describe()}",
            flush=True,
        )


def _chat_prompts(loaded, max_tokens: int) -> BenchPrompts:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "chats.jsonl"
        lines = [
            json.dumps({"id": i, "messages": [{"role": "user", "content": text}]})
            for i, text in enumerate(CHATS)
        ]
        path.write_text("\n".join(lines) + "\n")
        config = BenchConfig(model=MODEL, workload=str(path), max_tokens=max_tokens)
        return load_prompts(config, loaded.tokenizer, loaded.name)


def _chat_agreement(models, default_dtype, chats: BenchPrompts, peer) -> None:
    engine = EngineConfig()
    eos = models["float32"].eos_token_ids
    reference = [
        _until_eos(ids, eos) for ids in run_ours(models["float32"], chats, engine, 0).token_ids
    ]
    compared = sum(map(len, reference))
    print(
        f"real chats: {chats.num_prompts} questions, float32 greedy (the reference) up to its "
        f"end of sequence: {compared} tokens",
        flush=True,
    )
    outputs = {f"ours default ({default_dtype})": run_ours(models[default_dtype], chats, engine, 0)}
    outputs["llama-cpp Q4_1"] = peer.run(chats, 0)
    for name, run in outputs.items():
        print(f"  {name} vs float32: {_agree(chats.prompt_token_ids, run.token_ids, reference)}")


def _until_eos(ids, eos) -> list[int]:
    for index, token in enumerate(ids):
        if token in eos:
            return list(ids[: index + 1])
    return list(ids)


def _agree(prompts, ours, reference) -> str:
    figures = agreement(
        [list(p) for p in prompts], [list(o) for o in ours], [list(r) for r in reference]
    )
    return (
        f"{figures['exact_rows']}/{figures['rows']} rows identical, "
        f"{figures['token_agreement']:.1%} of tokens agree, "
        f"{figures['leading_agreement']:.1%} before each row's first difference"
    )


def _rate(run) -> str:
    return f"{run.wall_seconds:.2f} s, {run.generated_tokens_per_second:.1f} generated tokens/s"


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
