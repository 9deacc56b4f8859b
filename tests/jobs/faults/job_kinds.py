"""What a drawn configuration's job computes beyond plain generation: a task (`--task score`
or `embed`), LoRA adapters that rows pick one by one, and images in rows.

Drawn from streams of their own (`draw_kind`), so the formats, executors and faults each seed
drew before these dimensions existed are unchanged. Score and embed run on the local executor
and write Parquet only, so they are drawn only where the rest allows them; adapters go with
generation (on either executor, and an OpenAI line picks one by `body.model`). Images go with
plain generation (on either executor), on a tiny LLaVA built once beside the test model: rows
cycle three images (so the encoder and prefix caches are hit across a resume; their data URLs
long enough to wait as byte ranges of a plain JSONL file), and some bad rows carry an
undecodable image instead of a bad prompt.
"""

from __future__ import annotations

import base64
import io
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_NAMES = ("a", "b")


@dataclass(frozen=True)
class JobKind:
    task: str = "generate"  # "generate" | "score" | "embed"
    adapters: bool = False  # rows cycle adapter a, the base model, adapter b
    images: bool = False  # rows carry one of three images, on a tiny LLaVA

    def describe(self) -> str:
        extras = (", LoRA a/base/b" if self.adapters else "") + (", images" if self.images else "")
        return f"task {self.task}{extras}"


def draw_kind(seed: int, *, uses_ray: bool, input_format: str, output_format: str) -> JobKind:
    rng = random.Random(f"job-kind-{seed}")
    task = "generate"
    if not uses_ray and input_format != "openai" and output_format != "openai-jsonl":
        task = rng.choice(("generate", "generate", "score", "embed"))
    adapters = task == "generate" and rng.random() < 0.3
    images = (
        task == "generate" and not adapters and random.Random(f"job-images-{seed}").random() < 0.3
    )
    return JobKind(task, adapters=adapters, images=images)


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


def image_png(index: int) -> bytes:
    """Row `index`'s image: one of three random PNGs (40x50, 48x36, 32x32)."""
    from vision_kit import random_image

    sizes = ((40, 50), (48, 36), (32, 32))
    buffer = io.BytesIO()
    random_image(100 + index % 3, sizes[index % 3]).save(buffer, format="PNG")
    return buffer.getvalue()


BROKEN_PNG = b"\x89PNG\r\n\x1a\n but not an image"


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def kind_model(kind: JobKind, model: Path) -> Path:
    """The model a job of `kind` runs: a tiny LLaVA (made once beside `model`) for images."""
    if not kind.images:
        return model
    from vision_kit import save_tiny_llava

    path = model.parent / f"{model.name}-fault-llava"
    if not (path / "config.json").is_file():
        temp = model.parent / f".{path.name}.tmp"
        shutil.rmtree(temp, ignore_errors=True)
        save_tiny_llava(temp)
        temp.rename(path)
    return path


def kind_args(kind: JobKind, model: Path, input_format: str) -> list[str]:
    """The job options of `kind` (adapters made once beside the model directory)."""
    args = [] if kind.task == "generate" else ["--task", kind.task]
    if kind.images and input_format != "openai":  # OpenAI lines name theirs in image_url parts
        args += ["--image-column", "image"]
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
