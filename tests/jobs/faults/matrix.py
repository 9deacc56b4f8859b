"""One point of the job matrix, drawn from a seed: input format and layout, output format,
executors, storage, sampling, checkpoint cadence, and the faults each attempt gets.

Everything here is a function of the seed (`draw`), so a failure's seed reproduces it:
``scripts/soak --seed N`` runs exactly that configuration again.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hf_layouts import write_saved_dataset
from jobs.faults.job_kinds import (
    BROKEN_PNG,
    JobKind,
    adapter_of,
    data_url,
    draw_kind,
    image_png,
    row_fields,
)

from astrai_batch.jobs.crash_points import POINTS

INPUT_FORMATS = ("parquet", "parquet-dir", "jsonl", "jsonl.gz", "openai")
# a directory of row groups is, for an odd seed, a `datasets` save_to_disk directory (Arrow
# IPC shards, record batches as row groups): taken from the seed, so no other draw moves
ROW_GROUP_DIRECTORIES = ("parquet-dir", "datasets-dir")
OUTPUT_FORMATS = ("parquet", "parquet-dir", "openai-jsonl")
PREFIXES = (
    "You are a helpful assistant. Answer briefly and precisely.",
    "Summarise the following article about batch inference and caching.",
    "Translate to German: the weather is nice today and we go for a walk.",
)


@dataclass(frozen=True)
class Fault:
    """What one attempt suffers: a crash point (`point`, its `count`-th passage), a kill -9
    after `delay` seconds, or nothing (the attempt that must complete)."""

    kind: str  # "crash" | "kill" | "none"
    point: str | None = None
    count: int = 1
    delay: float = 0.0

    def describe(self) -> str:
        if self.kind == "crash":
            return f"crash at {self.point}:{self.count}"
        if self.kind == "kill":
            return f"kill -9 after {self.delay:.1f} s"
        return "no fault"


@dataclass(frozen=True)
class Matrix:
    seed: int
    rows: int
    input_format: str
    row_groups: tuple[int, ...]  # Parquet row-group sizes, or rows per file of a directory
    bad_rows: tuple[int, ...]
    duplicate_rows: tuple[int, ...]  # rows whose id repeats the one before
    output_format: str
    executors: tuple[str, ...]  # per attempt: "local" or "ray"
    workers: int
    storage: str  # "local" | "s3"
    sampled: bool
    n: int
    max_tokens: int
    checkpoint_rows: int
    group_window: int | None
    faults: tuple[Fault, ...]  # per attempt; the last is "none"
    kind: JobKind = field(default_factory=JobKind)  # the task and adapters (`job_kinds`)

    @property
    def uses_ray(self) -> bool:
        return "ray" in self.executors

    def describe(self) -> str:
        layout = f" groups {list(self.row_groups)}" if self.row_groups else ""
        switch = "->".join(dict.fromkeys(self.executors)) if self.uses_ray else "local"
        sampling = ""  # score and embed sample nothing
        if self.kind.task == "generate":
            sampling = f"{'sampled' if self.sampled else 'greedy'} n={self.n}; "
        return (
            f"seed {self.seed}: {self.rows} rows {self.input_format}{layout}, "
            f"{len(self.bad_rows)} bad, {len(self.duplicate_rows)} duplicate ids -> "
            f"{self.output_format} on {self.storage}; executor {switch}"
            f"{f' ({self.workers} workers)' if self.uses_ray else ''}; {self.kind.describe()}; "
            f"{sampling}checkpoint every "
            f"{self.checkpoint_rows} rows, window {self.group_window or 'default'}; faults: "
            f"{', '.join(f.describe() for f in self.faults)}"
        )


def draw(seed: int, *, allow_ray: bool = True, allow_s3: bool = True) -> Matrix:
    rng = random.Random(seed)
    rows = rng.randint(10, 36)
    input_format = rng.choice(INPUT_FORMATS)
    row_groups: tuple[int, ...] = ()
    if input_format in ("parquet", "parquet-dir"):
        row_groups = _uneven_split(rng, rows, rng.randint(2, 5))
    if input_format == "parquet-dir":
        input_format = ROW_GROUP_DIRECTORIES[seed % 2]
    picks = rng.sample(range(rows), k=min(rows, rng.randint(0, 3) + rng.randint(0, 2)))
    cut = rng.randint(0, len(picks))
    bad, duplicates = tuple(sorted(picks[:cut])), tuple(sorted(p for p in picks[cut:] if p > 0))
    uses_ray = allow_ray and rng.random() < 0.3
    if uses_ray:
        first = rng.choice(("local", "ray"))
        other = "ray" if first == "local" else "local"
        executors = tuple(first if rng.random() < 0.6 else other for _ in range(4))
    else:
        executors = ("local",) * 4
    attempts = rng.randint(1, 3) + 1
    executors = executors[:attempts]
    faults = [_fault(rng, executor) for executor in executors[:-1]]
    faults.append(Fault("none"))
    output_format = rng.choice(OUTPUT_FORMATS)
    kind = draw_kind(
        seed, uses_ray=uses_ray, input_format=input_format, output_format=output_format
    )
    return Matrix(
        seed=seed,
        rows=rows,
        input_format=input_format,
        row_groups=row_groups,
        bad_rows=bad,
        duplicate_rows=duplicates,
        output_format=output_format,
        executors=executors,
        workers=rng.randint(1, 3),
        storage="s3" if allow_s3 and rng.random() < 0.3 else "local",
        sampled=rng.random() < 0.5,
        n=rng.choice((1, 1, 2)),
        max_tokens=rng.randint(2, 6),
        checkpoint_rows=rng.randint(1, 8),
        # A Ray run plans one global window; a local one that a Ray run may finish must too,
        # or prefix-group numbers (an output column) would legitimately differ.
        group_window=None if uses_ray else rng.choice((None, rng.randint(3, 12))),
        faults=tuple(faults),
        kind=kind,
    )


def _fault(rng: random.Random, executor: str) -> Fault:
    """A kill, or a crash point the attempt's executor passes (a Ray driver writes the
    manifest once and no local parts; its workers commit shard parts)."""
    if rng.random() < 0.4:
        return Fault("kill", delay=round(rng.uniform(1.0, 14.0), 1))
    if executor == "ray":
        points = [
            "shard_written",
            "manifest_written",
            "stats_written",
            "output_written",
            "checkpoint_removed",
        ]
    else:
        points = [p for p in POINTS if p != "shard_written"]
    point = rng.choice(points)
    repeats = executor == "local" and point in ("part_written", "manifest_written")
    return Fault("crash", point=point, count=rng.randint(1, 4) if repeats else 1)


def _uneven_split(rng: random.Random, total: int, parts: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, total), k=min(parts - 1, total - 1)))
    bounds = [0, *cuts, total]
    return tuple(b - a for a, b in itertools.pairwise(bounds))


# -- the input ---------------------------------------------------------------------------------


def records(matrix: Matrix) -> list[dict[str, Any]]:
    """The input rows as dicts: id, prompt (a bad row's prompt is not a string)."""
    rng = random.Random(matrix.seed + 1)
    out = []
    for i in range(matrix.rows):
        prompt = f"{rng.choice(PREFIXES)} Question {i}: what is {i % 7} plus {i % 5}?"
        out.append({"id": f"r{i}", "prompt": prompt})
    for i in matrix.duplicate_rows:
        out[i]["id"] = out[i - 1]["id"]
    return out


def completions_line(matrix: Matrix, index: int) -> bool:
    """Every fourth OpenAI line is a completions line of two prompts (and has no image)."""
    return matrix.input_format == "openai" and index % 4 == 1


def image_rows(matrix: Matrix) -> tuple[list[int], list[int]]:
    """An image job's rows with an undecodable image, and its good rows with an image."""
    several = {i for i in range(matrix.rows) if completions_line(matrix, i)}
    broken = [i for i in matrix.bad_rows[::2] if i not in several]
    good = [i for i in range(matrix.rows) if i not in matrix.bad_rows and i not in several]
    return broken, good


def write_input(matrix: Matrix, directory: Path) -> Path:
    """The input in the matrix's format under `directory`; returns INPUT's path."""
    rows = records(matrix)
    kind = matrix.kind
    # an image job's bad rows alternate: an undecodable image beside a good prompt, a bad prompt
    broken = set(matrix.bad_rows[::2]) if kind.images else set()
    bad_prompt = set(matrix.bad_rows) - broken
    fmt = matrix.input_format
    if fmt in ("parquet", *ROW_GROUP_DIRECTORIES):
        fields = [
            {"id": r["id"], **row_fields(kind, i, None if i in bad_prompt else r["prompt"])}
            for i, r in enumerate(rows)
        ]
        if kind.images:
            for i, row in enumerate(fields):
                row["image"] = BROKEN_PNG if i in broken else image_png(i)
        table = pa.Table.from_pylist(fields)
        if fmt == "parquet":
            path = directory / "in.parquet"
            with pq.ParquetWriter(path, table.schema) as writer:
                start = 0
                for size in matrix.row_groups:
                    writer.write_table(table.slice(start, size), row_group_size=size)
                    start += size
            return path
        if fmt == "datasets-dir":
            return write_saved_dataset(
                directory / "in", table, len(matrix.row_groups), min(matrix.row_groups)
            )
        path = directory / "in"
        path.mkdir()
        start = 0
        for k, size in enumerate(matrix.row_groups):
            pq.write_table(table.slice(start, size), path / f"part-{k}.parquet")
            start += size
        return path
    lines = []
    for i, row in enumerate(rows):
        if fmt == "openai":
            # every fourth line a completions line of two prompts: one output line behind
            # two engine requests, finished (and checkpointed) only once both are in
            several = completions_line(matrix, i)
            content: Any = row["prompt"]
            if kind.images and not several:
                image = BROKEN_PNG if i in broken else image_png(i)
                content = [
                    {"type": "image_url", "image_url": {"url": data_url(image)}},
                    {"type": "text", "text": row["prompt"]},
                ]
            body: dict[str, Any] = (
                {"prompt": [row["prompt"], f"{row['prompt']} Explain."]}
                if several
                else {"messages": [{"role": "user", "content": content}]}
            )
            # body.model names an adapter, or is left out (the base model); any other name
            # is a row error (the job serves --model or --served-model-name)
            if kind.adapters and adapter_of(i) is not None:
                body["model"] = adapter_of(i)
            if i in bad_prompt or (several and i in broken):
                body["prompt" if several else "messages"] = 17
            url = "/v1/completions" if several else "/v1/chat/completions"
            lines.append({"custom_id": row["id"], "method": "POST", "url": url, "body": body})
        else:
            line = {
                "id": row["id"],
                **row_fields(kind, i, 17 if i in bad_prompt else row["prompt"]),
            }
            if kind.images:
                line["image"] = data_url(BROKEN_PNG if i in broken else image_png(i))
            lines.append(line)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if fmt == "jsonl.gz":
        path = directory / "in.jsonl.gz"
        path.write_bytes(gzip.compress(text.encode()))
        return path
    path = directory / "in.jsonl"
    path.write_text(text, encoding="utf-8")
    return path
