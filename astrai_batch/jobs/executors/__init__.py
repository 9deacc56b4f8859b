"""Where a job runs: `local` (this process, windows over one engine: `jobs.job`) or `ray`
(prefix-aware shards on Ray workers, through Ray Data: `ray_job`)."""

from __future__ import annotations

from typing import TextIO

from astrai_batch.errors import ConfigError
from astrai_batch.io.filesystems import is_uri, resolve, shown_uri
from astrai_batch.jobs.config import JobConfig
from astrai_batch.jobs.summary import JobSummary


def run_with_executor(
    config: JobConfig, input_path: str, output_path: str, *, stderr: TextIO | None = None
) -> JobSummary:
    """Run the job with the executor its configuration names."""
    input_path = local_path(input_path, "INPUT", "is read from a local or shared path")
    if config.executor == "ray":
        from astrai_batch.jobs.executors.ray_job import run_ray_job

        return run_ray_job(config, input_path, output_path, stderr=stderr)
    from astrai_batch.jobs.job import run_job

    output_path = local_path(output_path, "OUTPUT", "may be a URI with --executor ray")
    return run_job(config, input_path, output_path, stderr=stderr)


def local_path(target: str, role: str, hint: str) -> str:
    """`target` as a local path: a ``file://`` URI becomes its path; other URIs are refused
    (what this executor cannot reach yet), with `hint` saying what works."""
    if not is_uri(target):
        return target
    if target.lower().startswith("file://"):
        return resolve(target).path
    # Named without resolving: opening a remote filesystem may already reach the network.
    shown = shown_uri(target)
    raise ConfigError(f"{role} {shown} is not on the local filesystem; {role} {hint}")
