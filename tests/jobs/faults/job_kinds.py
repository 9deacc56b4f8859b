"""What a drawn configuration's job computes beyond plain generation: a task (`--task score`
or `embed`) and LoRA adapters that rows pick one by one.

Drawn from a stream of its own (`draw_kind`), so the formats, executors and faults each seed
drew before these dimensions existed are unchanged. Score and embed run on the local executor
and write Parquet only, so they are drawn only where the rest allows them; adapters go with
generation (on either executor, and an OpenAI line picks one by `body.model`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_NAMES = ("a", "b")


@dataclass(frozen=True)
class JobKind:
    task: str = "generate"  # "generate" | "score" | "embed"
    adapters: bool = False  # rows cycle adapter a, the base model, adapter b

    def describe(self) -> str:
        return f"task {self.task}{', LoRA a/base/b' if self.adapters else ''}"


def draw_kind(seed: int, *, uses_ray: bool, input_format: str, output_format: str) -> JobKind:
    rng = random.Random(f"job-kind-{seed}")
    task = "generate"
    if not uses_ray and input_format != "openai" and output_format != "openai-jsonl":
        task = rng.choice(("generate", "generate", "score", "embed"))
    return JobKind(task, adapters=task == "generate" and rng.random() < 0.3)


def adapter_of(index: int) -> str | None:
    return (ADAPTER_NAMES[0], None, ADAPTER_NAMES[1])[index % 3]


def row_fields(kind: JobKind, index: int, prompt: Any) -> dict[str, Any]:
    """A row's fields but its id; `prompt` is its text, or what a bad row carries instead."""
    if kind.task == "score":
        return {"context": prompt, "continuations": [" yes", " no", f" {index % 10}"]}
    fields = {"prompt": prompt}
    if kind.adapters:
        fields["lora"] = adapter_of(index)
    return fields


def kind_args(kind: JobKind, model: Path) -> list[str]:
    """The job options of `kind` (adapters made once beside the model directory)."""
    args = [] if kind.task == "generate" else ["--task", kind.task]
    if kind.adapters:
        for name, path in ensure_adapters(model).items():
            args += ["--lora", f"{name}={path}"]
    return args


def ensure_adapters(model: Path) -> dict[str, Path]:
    """Two rank-4 PEFT adapters of `model`, written once beside it (built in a temporary
    directory, then renamed: a soak killed while making them leaves no half adapter)."""
    from lora_kit import make_adapter

    adapters = {}
    for seed, name in enumerate(ADAPTER_NAMES, start=1):
        path = model.parent / f"{model.name}-fault-lora-{name}"
        if not (path / "adapter_config.json").is_file():
            temp = model.parent / f".{path.name}.tmp"
            make_adapter(model, temp, rank=4, seed=seed)
            temp.rename(path)
        adapters[name] = path
    return adapters
