"""Starting a tensor-parallel model: the checks, the ranks, rank 0's shard, and its handle.

Order: the model is checked and its plan resolved from the config alone (a refused model
starts no process); the workers are started and wait at the rendezvous rank 0 hosts; every
rank loads its own shard; a barrier says all are loaded. `TensorParallel` is what
`LoadedModel.parallel` holds: `engine_setup` asks it to mirror each new engine on the other
ranks (`begin_engine`), the runner sends each step through its `sender`, and `close` ends the
ranks (on every exit path: the job closes it, `atexit` too, and the workers exit by
themselves when rank 0's process is gone).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from astrai_batch.engine.parallel.rank_group import START_WAIT_S, RankGroup
from astrai_batch.engine.parallel.rank_processes import (
    RankProcesses,
    WorkerSpec,
    started_from_main_thread,
)
from astrai_batch.engine.parallel.shard_plan import ShardPlan, shard_plan
from astrai_batch.engine.parallel.step_channel import StepChannel
from astrai_batch.errors import ConfigError, RankFailureError

if TYPE_CHECKING:
    from astrai_batch.engine.lora.adapter_files import AdapterFiles


class TensorParallel:
    """This process's rank: its group and step channel; on rank 0 also the workers."""

    def __init__(self, group: RankGroup, processes: RankProcesses | None, plan: ShardPlan) -> None:
        self.group = group
        self.channel = StepChannel(group)
        self.processes = processes
        self.plan = plan
        self.num_kv_heads = plan.num_kv_heads  # of the whole model (each rank holds its share)
        self._closed = False

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def sender(self) -> StepChannel | None:
        """The channel rank 0's runner sends its steps through; None on the other ranks."""
        return self.channel if self.rank == 0 else None

    def begin_engine(self, config: Any, *, static_decode: bool) -> None:
        """Called by `assemble_engine` on every rank before anything is sized: rank 0 sends the
        configuration, whereupon every other rank assembles the same engine (a profiled
        forward, a pool size agreement: the same collectives in the same order)."""
        if static_decode:
            raise ConfigError("static decode steps are not supported with tensor parallelism")
        if self.rank == 0:
            self.channel.send_engine(config)
        self.group.exact_sum = config.numerics == "invariant"

    def install_adapters(
        self, model: Any, adapters: Sequence[AdapterFiles], *, max_rank: int
    ) -> None:
        """Rank 0 (before its engine): installs its slices of every adapter (a refusal raises
        here, before any rank is told), then has every other rank read and install its own;
        returns once all hold them (a rank that cannot ends the job with its one line)."""
        from astrai_batch.engine.parallel.sharded_adapters import install_sharded

        install_sharded(model, adapters, self.plan, self.rank, max_rank=max_rank)
        if self.rank == 0:
            specs = [(adapter.name, adapter.shown, adapter.digest) for adapter in adapters]
            self.channel.send_adapters(specs, max_rank)
            self.group.barrier_after_load()

    def close(self) -> None:
        if self._closed or self.processes is None:
            self._closed = True
            return
        self._closed = True
        atexit.unregister(self.close)
        graceful = not self.group.failed
        if graceful:
            try:
                self.channel.send_stop()
            except RankFailureError:
                graceful = False
        self.processes.stop(graceful=graceful)


def load_parallel(prepared: Any, *, world_size: int, timeout_s: float):
    """Starts `world_size` ranks for a prepared load (`loader.prepare_load`) and returns rank
    0's `LoadedModel` (its shard, its KV heads, `parallel` set)."""
    from astrai_batch.engine.model.model_facts import loaded_model
    from astrai_batch.engine.parallel.sharded_load import load_shard, safetensors_index

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"tensor_parallel_size must be a positive integer, got {world_size!r}")
    if not timeout_s > 0:
        raise ConfigError(f"tp_timeout must be positive, got {timeout_s!r}")
    spec = prepared.model_spec
    plan = shard_plan(prepared.config, world_size, model_name=spec.name)
    devices = rank_devices(prepared.device, world_size)
    model_dir = _model_dir(prepared)
    safetensors_index(model_dir)  # refuses a checkpoint without safetensors before any start
    processes = RankProcesses(world_size)
    group = None
    try:
        group = RankGroup(
            rank=0,
            world_size=world_size,
            host="127.0.0.1",
            port=0,
            device=devices[0],
            timeout_s=timeout_s,
            diagnose=lambda err: processes.describe_failure(err, timeout_s),
        )
        for rank in range(1, world_size):
            processes.start(
                WorkerSpec(
                    rank=rank,
                    world_size=world_size,
                    port=group.port,
                    model_dir=str(model_dir),
                    model_name=spec.name,
                    dtype=str(prepared.dtype).removeprefix("torch."),
                    device=str(devices[rank]),
                    timeout_s=timeout_s,
                    trust_remote_code=bool(prepared.hub.get("trust_remote_code")),
                    max_model_len=prepared.context,
                    threads=torch.get_num_threads(),
                    parent_pid=os.getpid(),
                    die_with_parent=started_from_main_thread(),
                )
            )
        processes.wait_ready(max(timeout_s, START_WAIT_S))
        group.connect()
        model = load_shard(
            model_dir,
            prepared.config,
            plan=plan,
            group=group,
            dtype=prepared.dtype,
            trust_remote_code=bool(prepared.hub.get("trust_remote_code")),
        )
        group.barrier_after_load()  # every rank holds its shard
    except BaseException:
        processes.stop(graceful=False)
        raise
    parallel = TensorParallel(group, processes, plan)
    atexit.register(parallel.close)
    loaded = loaded_model(model, prepared.tokenizer, spec, prepared.context)
    return dataclasses.replace(loaded, num_kv_heads=plan.local_kv_heads, parallel=parallel)


def rank_devices(device: torch.device, world_size: int) -> list[torch.device]:
    """CPU: every rank on the CPU. CUDA: rank r on GPU r (from the one given)."""
    if device.type == "cpu":
        return [device] * world_size
    first = device.index or 0
    count = torch.cuda.device_count()
    if first + world_size > count:
        raise ConfigError(
            f"--tensor-parallel-size {world_size} needs {world_size} GPUs from {device}, "
            f"this machine has {count}"
        )
    return [torch.device(device.type, first + r) for r in range(world_size)]


def _model_dir(prepared: Any) -> Path:
    """The local directory of the model's files (a hub model's snapshot, fetched if needed)."""
    spec = prepared.model_spec
    if spec.kind != "hub":
        return Path(spec.location)
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            spec.location,
            revision=prepared.hub.get("revision"),
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"],
        )
    )
