"""What a report shows about one finished job, read from its output and the stats file beside
it: the job's facts (the stats file's metadata: options, model, the time series), the totals
row, each row's prompt and completion lengths, finish reasons and error reasons.

Rows are read a batch at a time and only the columns a report needs, so a large output costs
two integers per row, not its completions.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from astrai_batch.errors import InputError
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.jobs.output.assembly import stats_location
from astrai_batch.jobs.output.dir_ownership import INDEX_NAME
from astrai_batch.jobs.output.timeline import TIMELINE_KEY, Timeline

ROW_COLUMNS = ("prompt_tokens", "completion_tokens", "finish_reason", "error")
MAX_ERROR_GROUPS = 200  # distinct reasons kept; the rest are counted as "other"
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"-?\b\d+(?:\.\d+)?\b")


@dataclass
class ErrorGroups:
    """Error rows grouped by their reason with quoted values and numbers masked, so "row
    'a': field 'x' ..." and "row 'b': field 'y' ..." count together; one example each."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    other: int = 0

    def add(self, message: str) -> None:
        key = _NUMBER.sub("N", _QUOTED.sub("'…'", message))
        if key not in self.counts and len(self.counts) >= MAX_ERROR_GROUPS:
            self.other += 1
            return
        self.counts[key] += 1
        self.examples.setdefault(key, message)

    def most_common(self, count: int) -> list[tuple[str, int, str]]:
        """(pattern, rows, an example) for the `count` largest groups."""
        return [(key, n, self.examples[key]) for key, n in self.counts.most_common(count)]


@dataclass(frozen=True)
class JobData:
    output: str
    output_format: str
    config: dict[str, Any]
    model: dict[str, Any]
    version: str | None
    total: dict[str, Any]  # the stats file's total row
    windows: int
    timeline: Timeline | None
    prompt_tokens: np.ndarray  # of the rows that ran (error rows have no lengths)
    completion_tokens: np.ndarray
    finish_reasons: Counter[str]
    errors: ErrorGroups

    @property
    def rows(self) -> int:
        return int(self.total.get("rows") or 0)

    @property
    def failed_rows(self) -> int:
        return self.finish_reasons.get("error", 0)

    @property
    def status(self) -> str:
        if self.rows and self.failed_rows >= self.rows:
            return "failed"
        return "completed with errors" if self.failed_rows else "completed"


def read_job(output_path: str) -> JobData:
    """The report's view of the job whose OUTPUT is `output_path` (a path or a URI)."""
    output = resolve(output_path)
    if not output.exists(InputError):
        raise InputError(f"no output at {output.shown}")
    stats = stats_location(output)
    if not stats.is_file(InputError):
        raise InputError(
            f"no stats file {stats.shown} beside the output: a report needs the output of "
            "`astrai-batch run` with its stats"
        )
    metadata = {
        key.decode(): value.decode()
        for key, value in (stats.read_parquet_schema().metadata or {}).items()
    }
    config = _json(metadata, "astrai_batch.config")
    totals = [row for row in stats.read_parquet().to_pylist() if row["is_total"]]
    if len(totals) != 1:
        raise InputError(f"{stats.shown} is not a stats file of astrai-batch (no total row)")
    windows = sum(
        1 for row in stats.read_parquet(["is_total", "window"]).to_pylist() if not row["is_total"]
    )
    timeline = None
    if TIMELINE_KEY in metadata:
        try:
            timeline = Timeline.from_json(metadata[TIMELINE_KEY])
        except ValueError as exc:
            raise InputError(f"{stats.shown}: its time series is damaged ({exc})") from exc
    output_format = str(config.get("output_format") or _format_of(output))
    prompt: list[np.ndarray] = []
    completion: list[np.ndarray] = []
    reasons: Counter[str] = Counter()
    errors = ErrorGroups()
    for batch in _row_batches(output, output_format):
        ran = np.array([reason != "error" for reason in batch["finish_reason"]], dtype=bool)
        prompt.append(np.asarray(batch["prompt_tokens"], dtype=np.int64)[ran])
        completion.append(np.asarray(batch["completion_tokens"], dtype=np.int64)[ran])
        reasons.update(reason or "unknown" for reason in batch["finish_reason"])
        for message in batch["error"]:
            if message:
                errors.add(message)
    return JobData(
        output=output.shown,
        output_format=output_format,
        config=config,
        model=_json(metadata, "astrai_batch.model"),
        version=metadata.get("astrai_batch.version"),
        total=totals[0],
        windows=windows,
        timeline=timeline,
        prompt_tokens=np.concatenate(prompt) if prompt else np.zeros(0, np.int64),
        completion_tokens=np.concatenate(completion) if completion else np.zeros(0, np.int64),
        finish_reasons=reasons,
        errors=errors,
    )


def _json(metadata: Mapping[str, str], key: str) -> dict[str, Any]:
    try:
        value = json.loads(metadata.get(key, "{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _format_of(output: Location) -> str:
    if output.is_dir(InputError):
        return "parquet-dir"
    return "openai-jsonl" if output.name.endswith(".jsonl") else "parquet"


def _row_batches(output: Location, output_format: str) -> Iterator[dict[str, list[Any]]]:
    """The report's columns, a batch at a time: one entry per output row (per sample)."""
    if output_format == "openai-jsonl":
        yield from _openai_batches(output)
        return
    if output_format == "parquet-dir":
        index = json.loads(output.child(INDEX_NAME).read_bytes())
        files = [output.child(entry["file"]) for entry in index["parts"]]
    else:
        files = [output]
    for location in files:
        with location.open_input_file() as handle:
            parquet = pq.ParquetFile(handle)
            names = [name for name in ROW_COLUMNS if name in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=65536, columns=names):
                columns = batch.to_pydict()
                size = batch.num_rows
                yield {name: columns.get(name, [None] * size) for name in ROW_COLUMNS} | {
                    "prompt_tokens": [v or 0 for v in columns.get("prompt_tokens", [0] * size)],
                    "completion_tokens": [
                        v or 0 for v in columns.get("completion_tokens", [0] * size)
                    ],
                }


def _openai_batches(output: Location) -> Iterator[dict[str, list[Any]]]:
    """OpenAI Batch output lines: lengths from `usage`, one finish reason per choice (the
    line's completion tokens on its first choice), an error line's message."""
    batch: dict[str, list[Any]] = {name: [] for name in ROW_COLUMNS}
    with output.open_lines() as lines:
        for raw in lines:
            if not raw.strip():
                continue
            line = json.loads(raw)
            error = line.get("error")
            body = (line.get("response") or {}).get("body") or {}
            usage = body.get("usage") or {}
            choices = body.get("choices") or [{}]
            for position, choice in enumerate(choices):
                batch["prompt_tokens"].append(int(usage.get("prompt_tokens") or 0))
                tokens = usage.get("completion_tokens") if position == 0 else 0
                batch["completion_tokens"].append(int(tokens or 0))
                batch["finish_reason"].append("error" if error else choice.get("finish_reason"))
                batch["error"].append((error or {}).get("message") if error else None)
            if len(batch["error"]) >= 65536:
                yield batch
                batch = {name: [] for name in ROW_COLUMNS}
    if batch["error"]:
        yield batch
