"""The run lock of an output on an object store: a lease object (moto's S3 server on
127.0.0.1). A live lease refuses a second run with the holder's pid and host; a dead one
(its process gone on this host, or not refreshed in time) is taken over; a holder keeps its
lease fresh, re-reads it before every commit, and never writes over a newcomer's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from wrapped_fs import ReadLog, counted

from astrai_batch.io.filesystems import resolve
from astrai_batch.jobs.output.lease_lock import LeaseLock, LeaseTiming, process_namespace
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
    here = {"pid": int(dead.stdout), "host": socket.gethostname(), **process_namespace()}
    plant(s3_bucket, "lease2", **here, refreshed=time.time())
    lock = lease_at(s3_bucket, "lease2")
    lock.acquire()
    assert lock.read()["pid"] == os.getpid()
    assert lock.read()["pid_ns"] == os.readlink("/proc/self/ns/pid")
    lock.release()


@pytest.mark.parametrize(
    "namespace",
    [{}, {"pid_ns": "pid:[1]"}, {"boot_id": "another-boot"}],
    ids=["unrecorded", "other-pid-namespace", "other-boot"],
)
def test_a_dead_pid_of_another_pid_namespace_holds_until_stale(s3_bucket, namespace) -> None:
    """Containers share a hostname but not pids: a pid is asked only in the holder's own
    pid namespace of the same boot (before: same hostname and pid gone meant dead)."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    lease = {"pid": int(dead.stdout), "host": socket.gethostname(), **process_namespace()}
    lease = {k: v for k, v in {**lease, **namespace}.items() if k in lease or k in namespace}
    if not namespace:
        del lease["boot_id"], lease["pid_ns"]
    plant(s3_bucket, "lease5", **lease, refreshed=time.time())
    with pytest.raises(RunLockedError, match=f"pid {int(dead.stdout)} on"):
        lease_at(s3_bucket, "lease5").acquire()
    plant(s3_bucket, "lease5", **lease, refreshed=time.time() - 3.0)
    lock = lease_at(s3_bucket, "lease5")
    lock.acquire()
    lock.release()


def test_verify_rereads_the_lease_and_refuses_a_foreign_token(s3_bucket) -> None:
    """No heartbeat runs in between (it beats every 30 s): verify itself must look."""
    slow = LeaseTiming(stale_seconds=60.0, heartbeat_seconds=30.0, settle_seconds=0.05)
    lock = LeaseLock(resolve(s3_bucket.uri("lease6")), "s3://bucket/out.parquet", slow)
    lock.acquire()
    lock.verify()
    plant(s3_bucket, "lease6", pid=1, host="elsewhere", refreshed=time.time())
    with pytest.raises(RunLockedError) as caught:
        lock.verify()
    assert str(caught.value) == (
        "another astrai-batch run (pid 1 on elsewhere) is writing s3://bucket/out.parquet; it "
        "took over this run's lease (this run was paused or cut off for too long), so this "
        "run writes no output"
    )
    lock.release()
    assert lock.read()["token"] == "theirs"


def test_a_late_heartbeat_never_overwrites_a_newcomers_lease(s3_bucket) -> None:
    """The holder's heartbeat reads its own lease, and the answer comes back only after the
    lease went stale and a newcomer took it over (a slow network). Before: the heartbeat
    then wrote its token over the newcomer's."""
    log = ReadLog()
    timing = LeaseTiming(stale_seconds=1.0, heartbeat_seconds=0.2, settle_seconds=0.05)
    label = "s3://bucket/out.parquet"
    holder = LeaseLock(counted(resolve(s3_bucket.uri("lease7")), log), label, timing)
    holder.acquire()
    log.stall.set()  # the holder's next read answers late
    deadline = time.monotonic() + 10
    newcomer = LeaseLock(resolve(s3_bucket.uri("lease7")), label, timing)
    while True:
        try:
            newcomer.acquire()
            break
        except RunLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    taken = newcomer.read()["token"]
    log.release.set()  # the stalled heartbeat read returns the holder's own (old) lease
    time.sleep(3 * timing.heartbeat_seconds)
    assert newcomer.read()["token"] == taken
    newcomer.verify()
    with pytest.raises(
        RunLockedError, match=r"^this run lost its lease on s3://bucket/out\.parquet "
    ):
        holder.verify()
    log.stall.clear()
    holder.release()
    newcomer.release()
    assert s3_bucket.names("lease7") == []


def test_another_hosts_lease_holds_until_it_goes_stale(s3_bucket) -> None:
    plant(s3_bucket, "lease3", pid=1, host="elsewhere", refreshed=time.time())
    with pytest.raises(RunLockedError, match=r"\(pid 1 on elsewhere\)"):
        lease_at(s3_bucket, "lease3").acquire()
    plant(s3_bucket, "lease3", pid=1, host="elsewhere", refreshed=time.time() - 3.0)
    lock = lease_at(s3_bucket, "lease3")
    lock.acquire()
    lock.release()


def test_the_holder_refreshes_its_lease(s3_bucket) -> None:
    lock = lease_at(s3_bucket, "lease4")
    lock.acquire()
    first = lock.read()["refreshed"]
    time.sleep(0.6)
    assert lock.read()["refreshed"] > first
    lock.verify()
    lock.release()
    assert s3_bucket.names("lease4") == []


def test_lock_for_picks_flock_locally_and_a_lease_on_an_object_store(s3_bucket, tmp_path) -> None:
    assert isinstance(lock_for(resolve(tmp_path / ".out.ckpt"), "out"), RunLock)
    assert isinstance(lock_for(resolve(s3_bucket.uri("x/.out.ckpt")), "out"), LeaseLock)
    with pytest.raises(ValueError, match="heartbeat_seconds must be > 0 and < stale_seconds"):
        LeaseTiming(stale_seconds=1.0, heartbeat_seconds=1.0)
