"""Three lm-eval tasks of our own over local JSON files (no hub): multiple choice with two
few-shot examples, a rolling perplexity task, a short greedy generation task (its `until`
holds a frequent letter, so the random tiny models' generations are cut by the stop rule)."""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [
    ("What is the capital of France?", ["Paris", "Berlin", "a quiet pond"], 0),
    ("The quick brown fox jumps over the", ["lazy dog", "river bank", "row groups"], 0),
    ("Parquet files store columns in", ["row groups", "the weather", "a haiku"], 0),
    ("Large language models generate text one", ["token at a time", "city", "dusk"], 0),
    ("Write a haiku about autumn", ["leaves falling", "fibonacci(n)", "German"], 0),
    ("Translate to German: the weather is", ["nice today", "a KV cache", "Paris"], 0),
    ("def fibonacci(n): return n if n <", ["2 else", "the lazy dog", "columns"], 0),
    ("Summarise the following article about", ["batch inference", "pond", "row"], 0),
]

DOCUMENTS = [
    "You are a helpful assistant. Answer the question briefly and precisely.",
    " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 4),
    "Parquet files store columns in row groups; each row group holds column chunks. " * 3,
    "Large language models generate text one token at a time using a KV cache.",
    "What is the capital of France? Paris is the capital and largest city. " * 5,
]

PROMPTS = [
    "The quick brown fox",
    "What is the capital of France?",
    "Parquet files store",
    "Write a haiku about",
    "Large language models",
    "Translate to German:",
]

MC_TASK = "astrai_mc"
PPL_TASK = "astrai_ppl"
GEN_TASK = "astrai_gen"
TASKS = [MC_TASK, PPL_TASK, GEN_TASK]


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def _source(data: Path) -> str:
    return (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    )


def write_tasks(folder: Path) -> Path:
    """The task YAMLs and their data under `folder` (lm-eval's `include_path`)."""
    folder.mkdir(parents=True, exist_ok=True)
    mc = _jsonl(
        folder / "mc.jsonl",
        [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS],
    )
    ppl = _jsonl(folder / "ppl.jsonl", [{"text": text} for text in DOCUMENTS])
    gen = _jsonl(folder / "gen.jsonl", [{"prompt": p, "answer": ""} for p in PROMPTS])
    (folder / "mc.yaml").write_text(
        f"task: {MC_TASK}\n{_source(mc)}fewshot_split: test\nnum_fewshot: 2\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (folder / "ppl.yaml").write_text(
        f"task: {PPL_TASK}\n{_source(ppl)}output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    (folder / "gen.yaml").write_text(
        f"task: {GEN_TASK}\n{_source(gen)}output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        '  until: ["n", "?"]\n  max_gen_toks: 12\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
        "    higher_is_better: true\n"
    )
    return folder
