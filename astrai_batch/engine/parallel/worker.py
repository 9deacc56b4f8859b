"""A tensor-parallel rank other than 0: load the shard, then run what rank 0 sends.

`python -m astrai_batch.engine.parallel.worker`, started by `rank_processes`, reads its
`WorkerSpec` from stdin. It then runs, until rank 0 says stop: a job's LoRA adapters -> read
them, install this rank's slices; a new engine's settings -> assemble the same engine over
this rank's shard and KV pool; a step's arrays (and its chunks' adapters) -> the same forward
(the model's collectives meet rank 0's). Anything wrong (rank 0 gone: stdin at EOF or
a broken collective; an error of its own) ends the process with one line on stderr and
status 1, never a hang.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1


def main() -> None:
    stdin = sys.stdin.buffer
    size = int.from_bytes(stdin.read(8), "little")
    spec = pickle.loads(stdin.read(size))
    if spec.die_with_parent:
        _die_with_parent(spec.parent_pid)
    threading.Thread(target=_exit_on_eof, args=(stdin,), daemon=True).start()
    try:
        _serve(spec)
    except BaseException as err:  # one line for rank 0's diagnosis, then out
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"rank {spec.rank}: {type(err).__name__}: {message}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def _serve(spec) -> None:
    import torch
    from transformers import AutoConfig

    from astrai_batch.engine.engine_setup import assemble_engine
    from astrai_batch.engine.model.loaded import LoadedModel
    from astrai_batch.engine.parallel.launch import TensorParallel
    from astrai_batch.engine.parallel.rank_group import RankGroup
    from astrai_batch.engine.parallel.shard_plan import shard_plan
    from astrai_batch.engine.parallel.sharded_adapters import read_as_rank_zero
    from astrai_batch.engine.parallel.sharded_load import load_shard
    from astrai_batch.engine.parallel.step_channel import ADAPTERS, ENGINE, STOP

    torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sys.stdout.buffer.write(b"R")  # running: rank 0 stops watching for an early death
    sys.stdout.buffer.flush()
    group = RankGroup(
        rank=spec.rank,
        world_size=spec.world_size,
        host="127.0.0.1",
        port=spec.port,
        device=device,
        timeout_s=spec.timeout_s,
    )
    group.connect()
    config = AutoConfig.from_pretrained(spec.model_dir, trust_remote_code=spec.trust_remote_code)
    plan = shard_plan(config, spec.world_size, model_name=spec.model_name)
    dtype = getattr(torch, spec.dtype)
    model = load_shard(
        spec.model_dir,
        config,
        plan=plan,
        group=group,
        dtype=dtype,
        trust_remote_code=spec.trust_remote_code,
    )
    group.barrier_after_load()
    loaded = LoadedModel(
        model=model,
        tokenizer=None,  # rank 0 tokenizes and samples
        name=spec.model_name,
        source=spec.model_dir,
        architecture=type(model).__name__,
        max_model_len=spec.max_model_len,
        eos_token_ids=frozenset(),
        num_layers=int(config.num_hidden_layers),
        num_kv_heads=plan.local_kv_heads,
        head_dim=plan.head_dim,
        has_chat_template=False,
        parallel=TensorParallel(group, None, plan),
    )
    parallel = loaded.parallel
    runner = None
    while True:
        command, value = parallel.channel.receive()
        if command == STOP:
            return
        if command == ENGINE:
            runner = None  # the previous engine's pool goes before the next is sized
            runner = assemble_engine(loaded, value).runner
        elif command == ADAPTERS:
            specs, max_rank = value
            adapters = read_as_rank_zero(specs)
            parallel.install_adapters(model, adapters, max_rank=max_rank)
            del adapters  # the whole matrices as read: this rank keeps its slices only
            group.barrier_after_load()
        else:
            step, slots = value
            adapters = None if slots is None else (slots.tolist(), step.num_tokens.tolist())
            runner.forward_step(step, adapters=adapters)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL when the starting thread of rank 0 ends (Linux); checked once for a parent
    that died before the request."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _exit_on_eof(stdin) -> None:
    """Rank 0 holds our stdin's other end: EOF means its process is gone."""
    while stdin.read(1 << 12):
        pass
    os._exit(1)


if __name__ == "__main__":
    main()
