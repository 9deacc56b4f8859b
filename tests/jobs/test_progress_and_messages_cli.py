"""What a job says on stderr when stderr is a log file (cron, Airflow), not a terminal: what it
is doing while the model loads, a plain progress line every --progress-seconds (rows
done/total, generated tokens/s, an ETA once it is measured), error text without doubled words,
and the summary's threads and named rates; --quiet says nothing."""

from __future__ import annotations

import re
from pathlib import Path

from jobs.jobkit import question, read_rows, start_process, summary_of, write_jsonl

from astrai_batch.engine.threads import available_cpus, cgroup_cpu_quota

LINE = re.compile(
    r"^astrai-batch: (\d+)/(\d+) rows \(\d+\.\d%\), \d+\.\d generated tok/s, "
    r"cache hit \d+\.\d%(, ETA \d+:\d\d:\d\d)?$"
)


def run(*args: object) -> tuple[int, str, str]:
    process = start_process(*args)
    stdout, stderr = process.communicate(timeout=300)
    return process.returncode, stdout, stderr


def test_a_log_gets_loading_steps_periodic_lines_and_a_summary_that_names_its_rates(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    rows = [{"id": f"r{i}", "prompt": question(i)} for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", [*rows, '{"id": "bad", "prompt": "abc'])
    output = tmp_path / "out.parquet"
    code, stdout, stderr = run(
        "run", source, output, "--model", tiny_llama_dir, "--kv-cache-memory", "8MiB",
        "--max-tokens", "160", "--ignore-eos", "--progress-seconds", "0.02",
    )  # fmt: skip
    assert code == 0, stderr
    lines = stderr.splitlines()
    cpus = available_cpus()
    loading = f"astrai-batch: loading model {tiny_llama_dir} ({cpus} CPU thread"
    assert lines[1].startswith(loading)
    assert re.fullmatch(r"astrai-batch: reading the weights of .* \(\d+ KiB\)", lines[2])
    progress = [LINE.match(line) for line in lines if re.search(r": \d+/\d+ rows", line)]
    assert len(progress) >= 3 and all(progress), stderr
    # The bad row finishes first, before any step: a line, but nothing to base an ETA on;
    # then lines keep coming while the other rows generate, with an ETA (160 steps of a
    # millisecond or more each against a 0.02 s interval: a fast CI machine once finished
    # 48 steps between two 0.05 s lines).
    first = progress[0]
    assert first.group(1) == "1" and " 0.0 generated tok/s" in first.group(0)
    assert first.group(3) is None
    for match in progress:
        assert (match.group(3) is None) == (" 0.0 generated tok/s" in match.group(0))
    assert sum(match.group(1) == "1" for match in progress) >= 2
    assert progress[-1].group(1) == progress[-1].group(2) == "7"
    summary = summary_of(stdout)
    assert summary["threads"] == cpus
    assert 0 < summary["generation_seconds"] < summary["wall_seconds"]
    assert summary["generation_tokens_per_second"] > summary["tokens_per_second"] > 0
    errors = {row["id"]: row["error"] for row in read_rows(output)}
    assert errors[None] == "line 7: invalid JSON: Unterminated string starting at column 25"


def test_quiet_says_nothing_on_stderr(tiny_llama_dir: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": question(i)} for i in range(2)])
    code, stdout, stderr = run(
        "run", source, tmp_path / "out.parquet", "--model", tiny_llama_dir,
        "--kv-cache-memory", "8MiB", "--max-tokens", "4", "--progress-seconds", "0.01",
        "--quiet", "--threads", "1",
    )  # fmt: skip
    assert code == 0, stderr
    assert stderr == ""
    assert summary_of(stdout)["threads"] == 1


def test_available_cpus_follow_the_affinity_mask_and_the_cgroup_quota(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cgroup_cpu_quota(tmp_path) is None
    assert available_cpus(tmp_path) == 4
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == 4
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    assert (cgroup_cpu_quota(tmp_path), available_cpus(tmp_path)) == (1.5, 2)
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").unlink()  # cgroup v1
    (tmp_path / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path) == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {5})
    assert available_cpus(tmp_path) == 1
