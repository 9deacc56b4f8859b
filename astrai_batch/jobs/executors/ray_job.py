"""A job on a Ray cluster, through Ray Data: the driver plans, Ray Data moves the rows.

The driver never holds the dataset. It reads only the input's footer (row count, columns,
fingerprint) and one small table per prefix group; rows flow as Ray Data blocks:

  range(chunks) --map_batches(ChunkReader: read, tokenize, key)--> keyed rows (materialized)
  keyed --groupby(group).map_groups(GroupSummarizer)--> one summary per prefix group -> driver
  driver: assign_shards (prefix-aware, balanced by estimated work) -> ShardPlan
  keyed --map_batches(Router)--> rows with their shard, finished shards dropped
        --groupby(shard).map_groups(ShardWorker, actor pool)--> one committed part per shard
  driver: parts -> output in input order + stats; then the checkpoint is removed

Reading goes through our own readers (a task per chunk of rows, `iter_rows(start)`), not
`read_parquet`, because a row's input index, id and row error must be exactly the local
run's, and Ray Data blocks carry no input index. Engine actors get a fractional CPU share
on machines with fewer CPUs than workers x threads, so one core stays free for Ray Data's
own tasks; their torch threads are set explicitly (`--worker-threads`).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, TextIO

from astrai_batch.errors import AstraiBatchError, ConfigError, OutputError
from astrai_batch.io import open_input
from astrai_batch.io.filesystems import Location, resolve
from astrai_batch.jobs.executors.ray_stages import (
    ChunkReader,
    Router,
    summaries_of,
    summarize_batch,
)
from astrai_batch.jobs.executors.ray_worker import ShardWorker
from astrai_batch.jobs.executors.shard_store import ShardInfo, ShardStore, job_hash
from astrai_batch.jobs.executors.sharded_output import write_sharded_outputs
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.assembly import (
    RUN_ID_KEY,
    output_metadata,
    remove_stale_temp_files,
    stats_location,
)
from astrai_batch.jobs.output.checkpoint import checkpoint_dir_for
from astrai_batch.jobs.output.output_lock import OutputLock, lock_for
from astrai_batch.jobs.output.parquet_dir import check_output_location
from astrai_batch.jobs.output.records import output_schema, part_schema
from astrai_batch.jobs.output.stats import total
from astrai_batch.jobs.planning.sharding import SHARDING_VERSION, assign_shards
from astrai_batch.jobs.progress import make_progress
from astrai_batch.jobs.summary import JobSummary

RAY_MISSING = "--executor ray needs Ray, which is not installed: pip install 'astrai-batch[ray]'"
CHUNKS_PER_CPU = 2
MIN_CHUNK_ROWS = 256


def require_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def run_ray_job(
    config: JobConfig, input_path: str, output_path: str, *, stderr: TextIO | None = None
) -> JobSummary:
    ray = require_ray()
    started = time.monotonic()
    output = resolve(output_path, OutputError)
    if output.is_local and not output.parent.is_dir():
        raise OutputError(f"output directory does not exist: {output.parent.shown}")
    # Before anything is touched, as in a local run: one run per output.
    lock = lock_for(checkpoint_dir_for(output), output.shown)
    lock.acquire()
    try:
        progress = make_progress(
            stderr or sys.stderr, quiet=config.quiet, interval=config.progress_seconds
        )
        try:
            return _run_locked(ray, config, resolve(input_path), output, lock, progress, started)
        finally:
            progress.close()
    finally:
        lock.release()


def _run_locked(
    ray: Any,
    config: JobConfig,
    input_path: Location,
    output: Location,
    lock: OutputLock,
    progress: Any,
    started: float,
) -> JobSummary:
    source = open_input(input_path, **config.input_options())
    kept = source.kept_schema()
    final_schema = output_schema(
        kept,
        save_tokens=config.save_tokens,
        logprobs=config.sampling.logprobs,
        task=config.task,
        top_logprobs=config.sampling.top_logprobs > 0,
        prompt_logprobs=config.sampling.prompt_logprobs is not None,
    )
    total_rows = source.count_rows()
    progress.message(f"{total_rows} rows ({source.shape}) in {input_path.shown}")
    from astrai_batch.engine import load_tokenizer
    from astrai_batch.engine.model.support import no_chat_template_message
    from astrai_batch.jobs.planning.tokenize import PromptEncoder

    tokenizer, tokenizer_source = load_tokenizer(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    encoder = PromptEncoder(
        tokenizer, config.model, chat_template_kwargs=config.chat_template_kwargs
    )
    if source.shape == "messages" and not encoder.has_chat_template:
        raise ConfigError(no_chat_template_message(config.model))
    fingerprint = source.fingerprint()
    # The model by name, revision and tokenizer location: the driver loads no weights.
    identity = {
        "input": fingerprint,
        "model": {"name": config.model, "revision": config.revision, "source": tokenizer_source},
        "options": config.result_options(),
        "shards": config.workers,
        "sharding": SHARDING_VERSION,
    }
    store = ShardStore(checkpoint_dir_for(output), job_hash(identity), config.workers)
    if _already_written(output, store, config):
        store.remove()
        progress.message(f"{output.shown} was already written by this job")
        return _summary(config, input_path, output, total_rows, {}, {}, started)
    check_output_location(output, config.output_format, config.overwrite)
    for target in (output, stats_location(output)):
        remove_stale_temp_files(target)  # a killed driver's half-written output or stats
    store.open(restart=config.restart)
    before = store.finished()
    if before:
        progress.message(f"resuming: shards {sorted(before)} of {config.workers} are done")
    owns_ray = _start_ray(ray, config)
    try:
        _run_pending(
            ray, config, input_path, store, before, part_schema(kept), total_rows, progress
        )
    finally:
        if owns_ray:
            ray.shutdown()
    infos = store.finished()
    totals = total(info.stats for info in infos.values())
    if totals.input_rows != total_rows:
        raise AstraiBatchError(
            f"the shards hold {totals.input_rows} of {total_rows} rows; rerun to finish"
        )
    if config.max_errors is not None and totals.failed_rows > config.max_errors.allowed(total_rows):
        return _summary(
            config, input_path, output, total_rows, infos, before, started, aborted=True
        )
    model = next(iter(infos.values())).model if infos else {"name": config.model}
    metadata = output_metadata(
        config=config.to_dict(), model=model, input_fingerprint=fingerprint, run_id=store.job
    )
    progress.message(f"writing {output.shown}")
    lock.verify()
    write_sharded_outputs(
        output=output,
        output_format=config.output_format,
        store=store,
        infos=infos,
        schema=final_schema,
        metadata=metadata,
        total_rows=total_rows,
        overwrite=config.overwrite,
        tokenizer=tokenizer,
        model_name=str(model.get("name")),
        created=int(time.time()),
    )
    store.remove()
    progress.close()
    return _summary(config, input_path, output, total_rows, infos, before, started)


def _start_ray(ray: Any, config: JobConfig) -> bool:
    """Connect to the cluster (or start a local one); True when this call started it."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if config.ray_address is not None:
        options["address"] = config.ray_address
    else:
        # A cluster of our own, for this process only: its processes talk over loopback.
        options["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot reach the Ray cluster at {config.ray_address}: {exc}") from exc
    return True


def actor_cpus(cluster_cpus: float, workers: int, threads: int) -> float:
    """CPUs reserved per engine actor: its threads, or less on a machine too small for that,
    so that at least one CPU stays free for Ray Data's read and shuffle tasks."""
    if workers * threads <= cluster_cpus - 1:
        return float(threads)
    return max(cluster_cpus - 1, 0.5) / workers


def _run_pending(
    ray: Any,
    config: JobConfig,
    input_path: Location,
    store: ShardStore,
    done: dict[int, ShardInfo],
    schema: Any,
    total_rows: int,
    progress: Any,
) -> None:
    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    cpus = float(ray.cluster_resources().get("CPU", 1))
    chunk_rows = max(MIN_CHUNK_ROWS, math.ceil(total_rows / max(1, CHUNKS_PER_CPU * cpus)))
    chunks = max(1, math.ceil(total_rows / chunk_rows))
    # Ray Data's default of 200 shuffle partitions is sized for large clusters; a partition
    # per CPU keeps a small job from spending its time scheduling empty tasks.
    partitions = max(1, int(cpus))
    reader = ChunkReader(input_path, config, chunk_rows, config.model)
    keyed = (
        ray.data.range(chunks, override_num_blocks=chunks)
        .map_batches(reader, batch_size=1, batch_format="pyarrow")
        .materialize()
    )
    summaries = (
        keyed.groupby("group", num_partitions=partitions)
        .map_groups(
            summarize_batch, fn_kwargs={"page_size": config.page_size}, batch_format="pyarrow"
        )
        .take_all()
    )
    plan = assign_shards(summaries_of(summaries), config.workers, config.page_size)
    progress.message(
        f"{len(summaries)} prefix groups in {config.workers} shards "
        f"(estimated work per shard: {', '.join(map(str, plan.loads))})"
    )
    routed = keyed.map_batches(Router(plan, frozenset(done)), batch_format="pyarrow")
    pending = config.workers - len(done)
    results = routed.groupby("shard", num_partitions=max(1, pending)).map_groups(
        ShardWorker,
        fn_constructor_args=(config, store, schema, config.worker_threads),
        compute=ray.data.ActorPoolStrategy(size=max(1, pending)),
        num_cpus=actor_cpus(cpus, max(1, pending), config.worker_threads),
        num_gpus=config.worker_gpus or None,
        batch_format="pyarrow",
    )
    for row in results.iter_rows():
        info = ShardInfo.from_json(row["info"])
        progress.message(
            f"shard {info.shard} done: {info.stats.input_rows} rows, "
            f"{info.prefix_groups} prefix groups, hit rate {info.stats.hit_rate:.3f}"
        )


def _already_written(output: Location, store: ShardStore, config: JobConfig) -> bool:
    """The output exists and this job wrote it (the driver died before removing the
    checkpoint)."""
    if config.restart or config.output_format != "parquet" or not output.exists():
        return False
    if not store.finished():  # only the run lock's file: no unfinished job of ours
        return False
    try:
        stored = output.read_parquet_schema().metadata or {}
    except Exception:
        return False
    return stored.get(RUN_ID_KEY.encode()) == store.job.encode()


def _summary(
    config: JobConfig,
    input_path: Location,
    output: Location,
    total_rows: int,
    infos: dict[int, ShardInfo],
    before: dict[int, ShardInfo],
    started: float,
    *,
    aborted: bool = False,
) -> JobSummary:
    totals = total(info.stats for info in infos.values())
    run = total(info.stats for shard, info in infos.items() if shard not in before)
    failed = totals.failed_rows
    if aborted:
        status, code = "aborted", 1
        message = f"{failed} rows failed, more than --max-errors allows; no output written"
    elif failed:
        status, code = "completed_with_errors", 3 if config.fail_on_row_errors else 0
        message = f"{failed} of {total_rows} rows failed"
    else:
        status, code, message = "completed", 0, None
    written = not aborted
    return JobSummary(
        status=status,
        exit_code=code,
        input=input_path.shown,
        output=output.shown if written else None,
        stats_output=stats_location(output).shown if written else None,
        output_format=config.output_format,
        model=config.model,
        total_rows=total_rows,
        totals=totals,
        resumed_rows=total(info.stats for info in before.values()).input_rows,
        run_decode_tokens=run.decode_tokens,
        run_wall_seconds=time.monotonic() - started,
        message=message,
    )
