"""One process group of tensor-parallel ranks: the collectives a step needs, each turned into
a one-line `RankFailureError` naming the rank when a peer dies or hangs.

The group is a `ProcessGroupGloo` / `ProcessGroupNCCL` object of our own over a `TCPStore`
(rank 0 hosts it on a free port), never torch's default process group: no process-wide
state, so one process can run several jobs, and a failed group is simply dropped.
Metadata (step arrays, commands, agreements) always goes over gloo on the host; on CUDA the
activations' reductions go over NCCL.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist

from astrai_batch.errors import RankFailureError

# Waits that are not a step's: the rendezvous (a worker still importing torch on a busy
# machine), the load barrier (a large shard read from slow storage) and a worker's wait for
# rank 0's next command (rank 0 may tokenize or write for long) are not failures when long.
START_WAIT_S = 600.0
LOAD_WAIT_S = 1800.0
IDLE_WAIT_S = 30 * 24 * 3600.0


def _gloo(store, rank: int, size: int, timeout: datetime.timedelta):
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, size, options)


def _nccl(store, rank: int, size: int, timeout: datetime.timedelta):
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size, options)


class RankGroup:
    """`rank` of `world_size`; `device` is where this rank's shard lives.

    `exact_sum` (invariant numerics): a row-parallel layer's partial products are gathered and
    added in rank order, one fixed sequence of float additions whatever the step holds; off:
    one all-reduce (faster on NCCL, whose order follows the tensor's size).
    `diagnose` turns a failed collective into the one-line message (rank 0 knows the worker
    processes; a worker only knows that rank 0 or a peer went away).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        host: str,
        port: int,
        device: torch.device,
        timeout_s: float,
        diagnose: Callable[[BaseException], str] | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.exact_sum = True
        self.failed = False  # a collective failed: the group is unusable, never waited on again
        self._diagnose = diagnose or (lambda err: f"tensor-parallel rank {rank}: {err}")
        # a step's collectives wait `timeout_s`; the group's own default is the patient start
        self._timeout = datetime.timedelta(seconds=max(timeout_s, START_WAIT_S))
        try:
            self.store = dist.TCPStore(
                host, port, world_size, rank == 0, timeout=self._timeout, wait_for_workers=False
            )
        except RuntimeError as err:
            raise RankFailureError(self._diagnose(err)) from err
        self.port = self.store.port  # rank 0: the free port it bound; the others dial it
        self.meta = self.compute = None

    def connect(self) -> None:
        """The rendezvous: returns once every rank has connected (or the timeout passed)."""
        rank, size, timeout = self.rank, self.world_size, self._timeout
        try:
            self.meta = _gloo(dist.PrefixStore("gloo", self.store), rank, size, timeout)
            cuda = self.device.type == "cuda"
            self.compute = _nccl(self.store, rank, size, timeout) if cuda else self.meta
        except RuntimeError as err:
            raise RankFailureError(self._diagnose(err)) from err

    # -- collectives ---------------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, *, wait_s: float | None = None) -> None:
        """`tensor` (on the host) from rank 0 to every rank, in place; `wait_s` replaces the
        step timeout (a worker waiting for the next command)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = self._seconds(wait_s)
        self._wait(lambda: self.meta.broadcast([tensor], options))

    def broadcast_started(self, tensor: torch.Tensor) -> Callable[[], None]:
        """Starts broadcasting `tensor` from rank 0; returns the wait for its completion (the
        tensor must not change before). Rank 0 goes on with its forward meanwhile, while the
        other ranks wake up."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = self._seconds(None)
        work = self._started(lambda: self.meta.broadcast([tensor], options))
        return lambda: self._wait(lambda: work)

    def min_int(self, value: int, *, wait_s: float | None = None) -> int:
        """The least of every rank's `value` (the ranks agree on one KV pool size)."""
        tensor = torch.tensor([value], dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        options.timeout = self._seconds(wait_s)
        self._wait(lambda: self.meta.allreduce([tensor], options))
        return int(tensor.item())

    def barrier_after_load(self) -> None:
        self.min_int(0, wait_s=max(self.timeout_s, LOAD_WAIT_S))

    def _seconds(self, wait_s: float | None) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s if wait_s is None else wait_s)

    def sum_partials(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of each rank's `partial` (a row-parallel layer's output)."""
        partial = partial.contiguous()
        if not self.exact_sum:
            options = dist.AllreduceOptions()
            options.timeout = self._seconds(None)
            self._wait(lambda: self.compute.allreduce([partial], options))
            return partial
        parts = self.gather(partial)
        total = parts[0]
        for part in parts[1:]:  # rank order: the same additions whatever the batch
            total.add_(part)
        return total

    def gather(self, part: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `part` (all of one shape), in rank order: a row-parallel layer's
        partials, a vocabulary-parallel head's logit columns."""
        part = part.contiguous()
        parts = [torch.empty_like(part) for _ in range(self.world_size)]
        gather = dist.distributed_c10d.AllgatherOptions()
        gather.timeout = self._seconds(None)
        self._wait(lambda: self.compute.allgather([parts], [part], gather))
        return parts

    def _wait(self, start: Callable[[], object]) -> None:
        work = self._started(start)
        try:
            work.wait()
        except RuntimeError as err:  # gloo and NCCL raise RuntimeError (DistError is one)
            self.failed = True
            raise RankFailureError(self._diagnose(err)) from err

    def _started(self, start: Callable[[], object]):
        try:
            return start()
        except RuntimeError as err:
            self.failed = True
            raise RankFailureError(self._diagnose(err)) from err
