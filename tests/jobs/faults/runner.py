"""Run one drawn configuration (`matrix.draw`) with its faults until it completes, and check
it against an uninterrupted local run of the same job.

Each attempt is the CLI as a child process (`python -m astrai_batch.cli run ...`), killed by
SIGKILL at a crash point (``ASTRAI_BATCH_CRASH_AT``) or after a delay, with the executor the
configuration names for that attempt. A switch of executor that the checkpoint refuses (it
holds the other executor's rows) is checked for its one-line message and rerun with the
checkpoint's executor. The finished output must equal the reference in every column but
`cached_tokens` (OpenAI lines: but the usage's cached tokens and the ids and `created` that
hash or time them); beside it only our output, its stats file, the input and a sentinel file
of the user's, untouched, may remain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from jobs.faults.job_kinds import kind_args, kind_model
from jobs.faults.matrix import Matrix, image_rows, write_input

from astrai_batch.jobs.crash_points import CRASH_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]
ATTEMPT_TIMEOUT = 600.0
SENTINEL = "user-notes.txt"
SENTINEL_TEXT = b"the user's own file: never touched\n"
REFUSED = "holds rows finished by --executor "
EXISTS = "already exists; pass --overwrite to replace it"
OUR_LINES = ("astrai-batch: ", "Error: ")
UNDECODABLE = "is not an image Pillow can decode"


class Mismatch(AssertionError):
    pass


@dataclass
class Outcome:
    matrix: Matrix
    attempts: int = 0
    kills: int = 0
    refused_switches: int = 0
    log: list[str] = field(default_factory=list)
    foreign_stderr: list[str] = field(default_factory=list)
    mismatch: str | None = None

    def line(self) -> str:
        state = "ok" if self.mismatch is None else f"MISMATCH: {self.mismatch}"
        return (
            f"{state} | {self.matrix.describe()} | {self.attempts} attempts, {self.kills} kills, "
            f"{self.refused_switches} refused switches"
        )


@dataclass(frozen=True)
class Place:
    """Where a configuration's files live: a local directory, or a prefix in an S3 bucket
    (`query` carries the endpoint, as a user's URI would)."""

    fs: pafs.FileSystem
    root: str  # a local directory, or "bucket/prefix"
    query: str | None = None

    def uri(self, name: str) -> str:
        if self.query is None:
            return f"{self.root}/{name}"
        return f"s3://test:test@{self.root}/{name}?{self.query}"

    def names(self) -> list[str]:
        selector = pafs.FileSelector(self.root, allow_not_found=True, recursive=True)
        infos = self.fs.get_file_info(selector)
        return sorted(
            info.path[len(self.root) + 1 :] for info in infos if info.type == pafs.FileType.File
        )

    def read(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.root}/{name}", compression=None) as stream:
            return stream.read()

    def write(self, name: str, data: bytes) -> None:
        path = f"{self.root}/{name}"
        if isinstance(self.fs, pafs.LocalFileSystem):  # an object store has no directories
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path, compression=None) as stream:
            stream.write(data)


def command(
    matrix: Matrix, model: Path, source: str, output: str, executor: str, ray_address: str | None
) -> list[str]:
    args = [
        sys.executable, "-m", "astrai_batch.cli", "run", source, output,
        "--model", str(kind_model(matrix.kind, model)), "--kv-cache-memory", "8MiB", "--quiet",
        "--output-format", matrix.output_format, "--checkpoint-rows", str(matrix.checkpoint_rows),
        *kind_args(matrix.kind, model, matrix.input_format),
    ]  # fmt: skip
    if matrix.group_window is not None:
        args += ["--group-window", str(matrix.group_window)]
    if matrix.kind.task == "generate":  # score and embed generate nothing
        args += ["--max-tokens", str(matrix.max_tokens), "--n", str(matrix.n)]
        if matrix.sampled:
            args += ["--temperature", "0.9", "--seed", "7"]
    if executor == "ray":
        args += ["--executor", "ray", "--workers", str(matrix.workers), "--worker-threads", "1"]
        if ray_address is not None:
            args += ["--ray-address", ray_address]
    return args


def attempt(
    args: list[str], crash_at: str | None, kill_after: float | None
) -> tuple[int, str, str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.pop(CRASH_ENV, None)
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    process = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        if kill_after is not None:
            try:
                out, err = process.communicate(timeout=kill_after)
                return process.returncode, out, err
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=ATTEMPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise Mismatch(f"an attempt ran past {ATTEMPT_TIMEOUT:.0f} s: {err[-300:]}") from None
    return process.returncode, out, err


def run_matrix(
    matrix: Matrix, model: Path, work: Path, place: Place, ray_address: str | None
) -> Outcome:
    outcome = Outcome(matrix)
    try:
        _run(matrix, model, work, place, ray_address, outcome)
    except Mismatch as exc:
        outcome.mismatch = str(exc)
    except Exception as exc:  # the harness itself: reported with the seed, never swallowed
        outcome.mismatch = f"harness error: {type(exc).__name__}: {exc}"
    return outcome


def _run(
    matrix: Matrix, model: Path, work: Path, place: Place, ray_address: str | None,
    outcome: Outcome,
) -> None:  # fmt: skip
    reference_dir = work / "reference"
    reference_dir.mkdir(parents=True)
    local_input = write_input(matrix, reference_dir)
    out_name = {"parquet": "out.parquet", "parquet-dir": "out", "openai-jsonl": "out.jsonl"}[
        matrix.output_format
    ]
    reference = Place(pafs.LocalFileSystem(), str(reference_dir))
    code, out, err = attempt(
        command(matrix, model, str(local_input), reference.uri(out_name), "local", None),
        None,
        None,
    )
    if code != 0:
        raise Mismatch(f"the uninterrupted reference run exited {code}: {err.strip()[-400:]}")
    if matrix.kind.images:
        _check_images(matrix, json.loads(out.strip().splitlines()[-1]), reference, out_name)
    # The configuration's own place: the input, a file of the user's, then the job.
    inputs = _upload(local_input, place)
    place.write(SENTINEL, SENTINEL_TEXT)
    source = place.uri(local_input.name)
    output = place.uri(out_name)
    schedule = list(zip(matrix.faults, matrix.executors, strict=True))
    refusals = 0
    killed = False  # the previous attempt was killed
    while schedule:
        fault, executor = schedule[0]
        outcome.attempts += 1
        args = command(matrix, model, source, output, executor, ray_address)
        crash = f"{fault.point}:{fault.count}" if fault.kind == "crash" else None
        # A Ray attempt spends its first tens of seconds starting workers.
        delay = fault.delay * (4 if executor == "ray" else 1) if fault.kind == "kill" else None
        code, out, err = attempt(args, crash, delay)
        outcome.log.append(f"attempt {outcome.attempts} ({executor}, {fault.describe()}): {code}")
        if code == -signal.SIGKILL:
            outcome.kills += 1
            schedule.pop(0)
            killed = True
            continue
        if code == 1 and killed and EXISTS in err and len(err.strip().splitlines()) == 1:
            # The kill landed after the job had committed its output and removed its
            # checkpoint (while the process was exiting): a rerun of a finished job is
            # refused, as a user's would be. The output and the leftovers are still checked.
            outcome.log.append("the killed attempt had finished the job")
            break
        killed = False
        if code == 1 and REFUSED in err:
            _check_refusal(err, output, outcome)
            refusals += 1
            if refusals > 3:
                raise Mismatch("the checkpoint was refused by both executors")
            other = "local" if executor == "ray" else "ray"
            schedule[0] = (fault, other)
            continue
        if code != 0:
            raise Mismatch(
                f"attempt {outcome.attempts} ({executor}, {fault.describe()}) exited {code}: "
                f"{err.strip()[-400:]}"
            )
        # Kept apart from mismatches: a library imported by the environment (not by us) may
        # print at import; the soak reports these lines rather than failing on them.
        outcome.foreign_stderr += [
            line for line in err.splitlines() if not line.startswith(OUR_LINES)
        ]
        if json.loads(out.strip().splitlines()[-1])["status"] not in (
            "completed",
            "completed_with_errors",
        ):
            raise Mismatch(f"finished as {out.strip()[-300:]}")
        break
    else:
        raise Mismatch("no attempt completed the job")
    _compare(matrix, reference, place, out_name)
    _check_leftovers(matrix, place, out_name, inputs)


def _check_images(matrix: Matrix, summary: dict, reference: Place, out_name: str) -> None:
    """The reference run of an image job really ran its images: one tower run per distinct
    image of its good rows, and each undecodable image its own row's error."""
    broken, good = image_rows(matrix)
    distinct = len({i % 3 for i in good})
    if summary["images_encoded"] != distinct:
        raise Mismatch(f"images_encoded {summary['images_encoded']}, expected {distinct}")
    rows = _normalized(reference, out_name, matrix.output_format)
    errors = sum(UNDECODABLE in json.dumps(row) for row in rows)
    if errors != len(broken):
        raise Mismatch(f"{errors} rows name an undecodable image, expected {len(broken)}")


def _check_refusal(err: str, output: str, outcome: Outcome) -> None:
    outcome.refused_switches += 1
    lines = err.strip().splitlines()
    if len(lines) != 1 or "--restart" not in lines[0]:
        raise Mismatch(f"a refused switch of executor is not one line naming --restart: {err}")


def _upload(local_input: Path, place: Place) -> list[str]:
    files = sorted(local_input.rglob("*")) if local_input.is_dir() else [local_input]
    names = []
    for path in files:
        if path.is_file():
            name = str(path.relative_to(local_input.parent))
            place.write(name, path.read_bytes())
            names.append(name)
    return names


def _compare(matrix: Matrix, reference: Place, place: Place, out_name: str) -> None:
    expected = _normalized(reference, out_name, matrix.output_format)
    got = _normalized(place, out_name, matrix.output_format)
    if got != expected:
        for position, (a, b) in enumerate(zip(got, expected, strict=False)):
            if a != b:
                raise Mismatch(f"output row {position} differs: {a} != {b}")
        raise Mismatch(f"output has {len(got)} rows, the reference {len(expected)}")


def _normalized(place: Place, out_name: str, output_format: str) -> list[Any]:
    if output_format == "openai-jsonl":
        lines = place.read(out_name).decode().splitlines()
        return [_without_timing(json.loads(line)) for line in lines]
    if output_format == "parquet":
        paths = [out_name]
    else:
        index = json.loads(place.read(f"{out_name}/_index.json"))
        paths = [f"{out_name}/{part['file']}" for part in index["parts"]]
    rows: list[Any] = []
    for path in paths:
        table = pq.read_table(f"{place.root}/{path}", filesystem=place.fs)
        rows += [{k: v for k, v in r.items() if k != "cached_tokens"} for r in table.to_pylist()]
    return rows


def _without_timing(value: Any) -> Any:
    """OpenAI lines without what depends on the run: cached tokens, `created`, and the ids
    hashed from them."""
    if isinstance(value, dict):
        return {
            k: _without_timing(v)
            for k, v in value.items()
            if k not in ("cached_tokens", "created", "id")
        }
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _check_leftovers(matrix: Matrix, place: Place, out_name: str, inputs: list[str]) -> None:
    if place.read(SENTINEL) != SENTINEL_TEXT:
        raise Mismatch("the user's file beside the output was changed")
    stats = out_name.removesuffix(".parquet").removesuffix(".jsonl") + ".stats.parquet"
    allowed = {SENTINEL, stats, *inputs}
    if matrix.output_format == "parquet-dir":
        index = json.loads(place.read(f"{out_name}/_index.json"))
        allowed |= {f"{out_name}/_index.json"}
        allowed |= {f"{out_name}/{part['file']}" for part in index["parts"]}
    else:
        allowed.add(out_name)
    extra = sorted(set(place.names()) - allowed)
    if extra:
        raise Mismatch(f"left behind: {extra}")
    missing = sorted(allowed - set(place.names()))
    if missing:
        raise Mismatch(f"missing: {missing}")


def elapsed_since(started: float) -> float:
    return time.monotonic() - started
