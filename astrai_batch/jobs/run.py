"""Running a job with the executor its configuration names: `local` (this process, windows
over one engine) or `ray` (prefix-aware shards on Ray workers through Ray Data). The job
flow is one (`jobs.job`); the executors differ only in how rows become checkpoint parts.
Both take INPUT and OUTPUT as local paths or URIs of any filesystem pyarrow supports
(`io.filesystems`)."""

from __future__ import annotations

from typing import TextIO

from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.summary import JobSummary


def run_with_executor(
    config: JobConfig, input_path: str, output_path: str, *, stderr: TextIO | None = None
) -> JobSummary:
    """Run the job with the executor its configuration names."""
    from astrai_batch.jobs.job import run_job

    return run_job(config, input_path, output_path, stderr=stderr)
