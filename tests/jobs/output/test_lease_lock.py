"""The run lock of an output on an object store: a lease object (moto's S3 server on
127.0.0.1). A live lease refuses a second run with the holder's pid and host; a dead one
(its process gone on this host, or not refreshed in time) is taken over; a holder keeps its
lease fresh and learns when it lost it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from astrai_batch.io.filesystems import resolve
from astrai_batch.jobs.output.lease_lock import LeaseLock, LeaseTiming
from astrai_batch.jobs.output.output_lock import lock_for
from astrai_batch.jobs.output.run_lock import LOCK_NAME, RunLock, RunLockedError

FAST = LeaseTiming(stale_seconds=2.0, heartbeat_seconds=0.2, settle_seconds=0.05)


def lease_at(s3_bucket, key: str) -> LeaseLock:
    return LeaseLock(resolve(s3_bucket.uri(key)), "s3://bucket/out.parquet", FAST)


def plant(s3_bucket, key: str, **lease) -> None:
    """A lease as another run would have written it."""
    with s3_bucket.fs.open_output_stream(f"bucket/{key}/{LOCK_NAME}") as stream:
        stream.write(json.dumps({"token": "theirs", **lease}).encode())


def test_a_live_lease_refuses_a_second_run_and_release_leaves_nothing(s3_bucket) -> None:
    first = lease_at(s3_bucket, "lease1/.out.ckpt")
    first.acquire()
    stored = first.read()
    assert stored is not None
    assert (stored["pid"], stored["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(RunLockedError) as caught:
        lease_at(s3_bucket, "lease1/.out.ckpt").acquire()
    assert str(caught.value) == (
        f"another astrai-batch run (pid {os.getpid()} on {socket.gethostname()}) is writing "
        "s3://bucket/out.parquet"
    )
    first.verify()
    first.release()
    assert s3_bucket.names("lease1") == []
    again = lease_at(s3_bucket, "lease1/.out.ckpt")
    again.acquire()
    again.release()


def test_a_lease_of_a_dead_process_on_this_host_is_free_at_once(s3_bucket) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    plant(
        s3_bucket, "lease2", pid=int(dead.stdout), host=socket.gethostname(), refreshed=time.time()
    )
    lock = lease_at(s3_bucket, "lease2")
    lock.acquire()
    assert lock.read()["pid"] == os.getpid()
    lock.release()


def test_another_hosts_lease_holds_until_it_goes_stale(s3_bucket) -> None:
    plant(s3_bucket, "lease3", pid=1, host="elsewhere", refreshed=time.time())
    with pytest.raises(RunLockedError, match=r"\(pid 1 on elsewhere\)"):
        lease_at(s3_bucket, "lease3").acquire()
    plant(s3_bucket, "lease3", pid=1, host="elsewhere", refreshed=time.time() - 3.0)
    lock = lease_at(s3_bucket, "lease3")
    lock.acquire()
    lock.release()


def test_the_holder_refreshes_its_lease_and_learns_when_it_was_taken(s3_bucket) -> None:
    lock = lease_at(s3_bucket, "lease4")
    lock.acquire()
    first = lock.read()["refreshed"]
    time.sleep(0.6)
    assert lock.read()["refreshed"] > first
    lock.verify()
    plant(s3_bucket, "lease4", pid=1, host="elsewhere", refreshed=time.time())
    time.sleep(0.6)
    with pytest.raises(RunLockedError) as caught:
        lock.verify()
    assert str(caught.value) == (
        "another astrai-batch run (pid 1 on elsewhere) is writing s3://bucket/out.parquet; it "
        "took over this run's lease (this run was paused or cut off for too long), so this "
        "run writes no output"
    )
    lock.release()
    assert lock.read()["token"] == "theirs"  # never taken back, never deleted


def test_lock_for_picks_flock_locally_and_a_lease_on_an_object_store(s3_bucket, tmp_path) -> None:
    assert isinstance(lock_for(resolve(tmp_path / ".out.ckpt"), "out"), RunLock)
    assert isinstance(lock_for(resolve(s3_bucket.uri("x/.out.ckpt")), "out"), LeaseLock)
    with pytest.raises(ValueError, match="heartbeat_seconds must be > 0 and < stale_seconds"):
        LeaseTiming(stale_seconds=1.0, heartbeat_seconds=1.0)
