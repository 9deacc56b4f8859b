"""Crash points for the fault-injection tests: a test-only hook at every write and commit
boundary of a job.

``ASTRAI_BATCH_CRASH_AT=<point>:<count>`` makes this process kill itself with SIGKILL (no
cleanup, no flush: what a power cut or the OOM killer does) the `count`-th time it reaches
`point`. Unset, a crash point is one dictionary lookup. The points, in the order a job
passes them:

- ``part_written``: a local checkpoint part is committed, the manifest does not list it yet
- ``manifest_written``: the checkpoint manifest is committed
- ``shard_written``: a Ray worker committed its shard's part, the driver does not know yet
- ``stats_written``: the stats file is committed, the output is not
- ``output_written``: the output is committed, the checkpoint is not removed yet
- ``checkpoint_removed``: the job is done, its process has not exited (a kill while it exits)

The count left is kept in the variable itself, so it survives nothing but this process:
a rerun (or a Ray worker, which inherits the environment) counts afresh.

``ASTRAI_BATCH_PAUSE_AT=<point>:<seconds>`` makes the process say so on stderr and sleep at
`point` instead, so a test can send a real signal at a known moment (``model_load``: the job
is about to load the model, the input is open and no checkpoint exists yet).
"""

from __future__ import annotations

import os
import signal
import sys
import time

CRASH_ENV = "ASTRAI_BATCH_CRASH_AT"
PAUSE_ENV = "ASTRAI_BATCH_PAUSE_AT"
PAUSE_POINTS = ("model_load",)
POINTS = (
    "part_written",
    "manifest_written",
    "shard_written",
    "stats_written",
    "output_written",
    "checkpoint_removed",
)


def crash_point(point: str) -> None:
    """Die here if ``ASTRAI_BATCH_CRASH_AT`` says this is the moment."""
    wanted = os.environ.get(CRASH_ENV)
    if wanted is None or not wanted.startswith(f"{point}:"):
        return
    left = int(wanted.split(":", 1)[1]) - 1
    if left > 0:
        os.environ[CRASH_ENV] = f"{point}:{left}"
        return
    os.kill(os.getpid(), signal.SIGKILL)


def pause_point(point: str) -> None:
    """Sleep here if ``ASTRAI_BATCH_PAUSE_AT`` names this point (a signal ends the sleep)."""
    wanted = os.environ.get(PAUSE_ENV)
    if wanted is None or not wanted.startswith(f"{point}:"):
        return
    sys.stderr.write(f"astrai-batch: pausing at {point}\n")
    sys.stderr.flush()
    time.sleep(float(wanted.split(":", 1)[1]))
