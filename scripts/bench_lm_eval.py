"""lm-eval's evaluator on a multiple-choice task: the `astrai-batch` backend against lm-eval's
own hf backend, the same model, in one invocation.

Run (lm-eval beside the venv, as scripts/test-long installs it):
    PYTHONPATH=.venv/lm-eval .venv/bin/python scripts/bench_lm_eval.py \
        [--model smollm2-135m] [--questions 1000] [--shots 0] [--hf-batch-size 16] [--threads 2]

The task (written to a temporary folder, offline): `--questions` arithmetic and lookup
questions with 4 choices each, MMLU-shaped: a task description and the same `--shots`
few-shot examples (lm-eval's `first_n` sampler; default 0) before every question, so
contexts share a prefix as MMLU's prompts share theirs. Each backend runs `simple_evaluate`
once (float32, CPU, `--threads` torch threads); printed: wall seconds of each (model load
included), acc, the largest per-choice log-likelihood difference, and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

THINGS = [
    ("the capital of France", "Paris", ["Lyon", "Berlin", "Madrid"]),
    ("the capital of Japan", "Tokyo", ["Osaka", "Seoul", "Beijing"]),
    ("the largest planet", "Jupiter", ["Mars", "Venus", "Mercury"]),
    ("the chemical symbol for gold", "Au", ["Ag", "Fe", "Pb"]),
    ("the author of Hamlet", "Shakespeare", ["Dickens", "Tolstoy", "Homer"]),
    ("the freezing point of water in Celsius", "0", ["100", "32", "-10"]),
]


def questions(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for number in range(count):
        if number % 3:
            a, b = rng.randrange(10, 100), rng.randrange(10, 100)
            right = a + b
            wrong = rng.sample([right + d for d in (-10, -1, 1, 2, 10, 11)], 3)
            question, answers = f"What is {a} + {b}?", [str(right), *map(str, wrong)]
        else:
            what, right, wrong = THINGS[rng.randrange(len(THINGS))]
            question, answers = f"What is {what}?", [right, *wrong]
        order = list(range(4))
        rng.shuffle(order)
        out.append(
            {
                "question": question,
                "choices": [answers[i] for i in order],
                "answer": order.index(0),
            }
        )
    return out


def write_task(folder: Path, count: int, shots: int) -> str:
    data = folder / "mc.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions(count, seed=7)))
    (folder / "mc.yaml").write_text(
        "task: bench_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\nfewshot_split: test\nnum_fewshot: {shots}\n"
        "fewshot_config:\n  sampler: first_n\n"
        'description: "The following are multiple choice questions (with answers) about '
        'arithmetic and general knowledge. Answer each with the correct choice.\\n\\n"\n'
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return "bench_mc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shots", type=int, default=0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lm-eval-"))
    os.environ["HF_DATASETS_CACHE"] = str(work / "datasets")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    import astrai_batch.lm_eval  # noqa: F401
    from astrai_batch.engine.model.gguf import ensure_converted
    from astrai_batch.engine.model.spec import resolve_model_spec

    torch.set_num_threads(args.threads)
    spec = resolve_model_spec(args.model)
    model_dir = spec.location
    if model_dir.endswith(".gguf"):  # the packaged SmolLM2: hf reads our converted directory
        model_dir = str(ensure_converted(Path(model_dir), None))
    task = write_task(work, args.questions, args.shots)
    manager = TaskManager(include_path=str(work))
    runs = {
        "hf": ("hf", f"pretrained={model_dir},dtype=float32", args.hf_batch_size),
        "astrai-batch": (
            "astrai-batch",
            f"model={args.model},dtype=float32,threads={args.threads}",
            args.hf_batch_size,
        ),
    }
    results = {}
    for name, (model, model_args, batch_size) in runs.items():
        started = time.perf_counter()
        result = lm_eval.simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=[task],
            task_manager=manager,
            batch_size=batch_size,
            device="cpu",
            log_samples=True,
            bootstrap_iters=0,
        )
        wall = time.perf_counter() - started
        samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
        results[name] = (wall, result["results"][task]["acc,none"], samples)
        print(f"{name}: {wall:.1f} s, acc {results[name][1]:.4f}", file=sys.stderr, flush=True)
    gap = max(
        abs(a[0][0] - b[0][0])
        for sa, sb in zip(results["hf"][2], results["astrai-batch"][2], strict=True)
        for a, b in zip(sa["resps"], sb["resps"], strict=True)
    )
    report = {
        "questions": args.questions,
        "pairs": 4 * args.questions,
        "hf_wall_s": round(results["hf"][0], 1),
        "astrai_batch_wall_s": round(results["astrai-batch"][0], 1),
        "speedup": round(results["hf"][0] / results["astrai-batch"][0], 2),
        "acc_hf": results["hf"][1],
        "acc_astrai_batch": results["astrai-batch"][1],
        "max_abs_loglikelihood_diff": gap,
        "command": shlex.join([sys.executable, *sys.argv]),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
