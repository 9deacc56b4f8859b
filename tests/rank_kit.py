"""Two tensor-parallel ranks in one process: a rank group each, joined over gloo on loopback
(rank 1 connects from a thread); and running one function on both ranks at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from astrai_batch.engine.parallel.rank_group import RankGroup


def rank_pair() -> tuple[RankGroup, RankGroup]:
    zero = RankGroup(
        rank=0, world_size=2, host="127.0.0.1", port=0, device=torch.device("cpu"), timeout_s=30
    )
    one = RankGroup(
        rank=1,
        world_size=2,
        host="127.0.0.1",
        port=zero.port,
        device=torch.device("cpu"),
        timeout_s=30,
    )
    joined = threading.Thread(target=one.connect)
    joined.start()
    zero.connect()
    joined.join()
    return zero, one


def on_both_ranks(run: Callable[[int], object]) -> dict[int, object]:
    """{rank: run(rank)}, rank 1 in a thread (their collectives meet), rank 0 here."""
    out: dict[int, object] = {}
    worker = threading.Thread(target=lambda: out.__setitem__(1, run(1)))
    worker.start()
    out[0] = run(0)
    worker.join(timeout=60)
    assert 1 in out, "rank 1 did not finish"
    return out
