"""The Ray executor: a job's rows as prefix-aware shards on Ray workers, through Ray Data.

The driver never holds the dataset. It reads only the input's footer (row count, columns,
fingerprint) and one small table per prefix group; rows flow as Ray Data blocks:

  range(chunks) --map_batches(ChunkReader: read, tokenize, key)--> keyed rows (materialized)
  keyed --map_batches(ignored_names)--> ignored OpenAI body field names -> driver warns once
  keyed --groupby(group).map_groups(GroupSummarizer)--> one summary per prefix group -> driver
  driver: assign_shards (prefix-aware, balanced by estimated work) -> ShardPlan
  keyed --map_batches(Router)--> rows with their shard, finished shards dropped
        --groupby(shard).map_groups(ShardWorker, actor pool)--> one committed part per shard

Everything around it (checks, checkpoint, summary, final files) is the job flow's
(`jobs.job`); shard parts are committed into the job's checkpoint (`shard_store`).

Reading goes through our own readers (a task per chunk of rows, `iter_rows(start)`), not
`read_parquet`, because a row's input index, id and row error must be exactly the local
run's, and Ray Data blocks carry no input index. Engine actors get a fractional CPU share
on machines with fewer CPUs than workers x threads, so one core stays free for Ray Data's
own tasks; their torch threads are set explicitly (`--worker-threads`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.errors import ConfigError
from astrai_batch.io import InputSource
from astrai_batch.jobs.executors.base import ExecutionResult, ModelFacts
from astrai_batch.jobs.executors.ray_quiet import quiet_ray_data, ray_errors_in_one_line, start_ray
from astrai_batch.jobs.executors.ray_stages import (
    ChunkReader,
    Router,
    ignored_names,
    summaries_of,
    summarize_batch,
)
from astrai_batch.jobs.executors.ray_worker import ShardWorker
from astrai_batch.jobs.executors.shard_store import ShardInfo, ShardStore
from astrai_batch.jobs.field_warnings import IgnoredFieldWarnings
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.checkpoint import Checkpoint, ExecutorMark
from astrai_batch.jobs.output.identity import model_identity_of
from astrai_batch.jobs.output.stats import total
from astrai_batch.jobs.planning.image_encoding import vision_model_at
from astrai_batch.jobs.planning.sharding import SHARDING_VERSION, assign_shards
from astrai_batch.jobs.progress import Progress

if TYPE_CHECKING:
    from astrai_batch.engine.lora.adapter_files import AdapterFiles

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


@dataclass
class RayExecutor:
    config: JobConfig
    # --task embed: the job's request, its pooling resolved on the driver as a local run does
    embed: EmbedRequest | None = field(default=None, init=False)
    # a vision-language model (decided once on the driver from the model's config): the
    # read tasks encode rows' images with its processor, the workers load its tower
    vision: bool = field(default=False, init=False)

    def mark(self) -> ExecutorMark:
        return ExecutorMark("ray", self.config.workers, SHARDING_VERSION)

    def prepare(
        self, source: InputSource, progress: Progress, adapters: Sequence[AdapterFiles] = ()
    ) -> ModelFacts:
        """`adapters` are checked by the flow; every worker reads them from their paths."""
        require_ray()
        from astrai_batch.engine import load_tokenizer
        from astrai_batch.engine.model.spec import resolve_model_spec
        from astrai_batch.engine.model.support import no_chat_template_message
        from astrai_batch.jobs.planning.tokenize import PromptEncoder

        config = self.config
        # The driver loads no weights: the model by its files, the tokenizer alone.
        tokenizer, tokenizer_source = load_tokenizer(
            config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
        )
        self.vision = vision_model_at(tokenizer_source, config.trust_remote_code)
        encoder = PromptEncoder(
            tokenizer, config.model, chat_template_kwargs=config.chat_template_kwargs
        )
        if source.shape == "messages" and not encoder.has_chat_template:
            raise ConfigError(no_chat_template_message(config.model))
        name = resolve_model_spec(config.model).name
        identity = model_identity_of(name, tokenizer_source, config.revision)
        hidden_size = None
        if config.task == "embed":
            hidden_size, self.embed = _embed_facts(config)
        return ModelFacts(identity, name, tokenizer, None, hidden_size=hidden_size)

    def execute(
        self,
        checkpoint: Checkpoint,
        source: InputSource,
        schema: pa.Schema,
        total_rows: int,
        progress: Progress,
    ) -> ExecutionResult:
        started = time.monotonic()
        before = checkpoint.shard_infos()
        if before:
            progress.message(f"resuming: shards {sorted(before)} of {self.config.workers} are done")
        ray = require_ray()
        store = ShardStore(checkpoint.directory, checkpoint.run_id, self.config.workers)
        with ray_errors_in_one_line():
            owns_ray = start_ray(ray, self.config)
            try:
                pending = (source, store, before, schema, total_rows, progress)
                pending += (self.embed, self.vision)
                _run_pending(ray, self.config, *pending)
            finally:
                if owns_ray:
                    ray.shutdown()
        after = checkpoint.shard_infos()
        run = total(info.stats for shard, info in after.items() if shard not in before)
        return ExecutionResult(run, time.monotonic() - started, None)

    def architecture(self, checkpoint: Checkpoint) -> str | None:
        infos = checkpoint.shard_infos()
        first = infos[min(infos)] if infos else None
        return None if first is None else first.model.get("architecture")

    def close(self) -> None:
        """Nothing to release: the workers' models end with the Ray job."""


def _embed_facts(config: JobConfig) -> tuple[int, EmbedRequest]:
    """The hidden size (the vectors' width without --dimensions) and the embed request, from
    the model's config and files alone (a GGUF is converted once, into the cache the workers
    read): the pooling a sentence-transformers model declares is the local run's."""
    from astrai_batch.engine.model.loader import prepare_load
    from astrai_batch.jobs.planning.embed_rows import job_embed_request

    prepared = prepare_load(
        config.model,
        device="cpu",  # the driver reads configs only; it may have no GPU
        dtype="float32",
        revision=config.revision,
        trust_remote_code=config.trust_remote_code,
        cache_dir=None,
        max_model_len=config.max_model_len,
    )
    request = job_embed_request(
        config.pooling, config.normalize, config.dimensions, prepared.model_spec.location
    )
    return int(prepared.config.hidden_size), request


def actor_cpus(cluster_cpus: float, workers: int, threads: int, ranks: int = 1) -> float:
    """CPUs reserved per engine actor: its threads for each of its `ranks` tensor-parallel
    processes (they run beside the actor on its node, outside Ray's own accounting: the
    reservation is the engine's N CPU bundles, packed on one node), or less on a machine too
    small for that, so that at least one CPU stays free for Ray Data's read and shuffle tasks."""
    wanted = threads * ranks
    if workers * wanted <= cluster_cpus - 1:
        return float(wanted)
    return max(cluster_cpus - 1, 0.5) / workers


def _run_pending(
    ray: Any,
    config: JobConfig,
    source: InputSource,
    store: ShardStore,
    done: dict[int, ShardInfo],
    schema: pa.Schema,
    total_rows: int,
    progress: Progress,
    embed: EmbedRequest | None,
    vision: bool,
) -> None:
    import ray.data

    quiet_ray_data(ray)
    cpus = float(ray.cluster_resources().get("CPU", 1))
    chunk_rows = max(MIN_CHUNK_ROWS, math.ceil(total_rows / max(1, CHUNKS_PER_CPU * cpus)))
    # Chunks start where the input's open scan recorded a row (every 256th: JSONL offsets).
    chunk_rows = math.ceil(chunk_rows / MIN_CHUNK_ROWS) * MIN_CHUNK_ROWS
    chunks = max(1, math.ceil(total_rows / chunk_rows))
    # Ray Data's default of 200 shuffle partitions is sized for large clusters; a partition
    # per CPU keeps a small job from spending its time scheduling empty tasks.
    partitions = max(1, int(cpus))
    reader = ChunkReader(source, config, chunk_rows, config.model, embed, vision)
    keyed = (
        ray.data.range(chunks, override_num_blocks=chunks)
        .map_batches(reader, batch_size=1, batch_format="pyarrow")
        .materialize()
    )
    # one warning per ignored body field name, as a local run writes them
    warnings = IgnoredFieldWarnings()
    taken = keyed.map_batches(ignored_names, batch_format="pyarrow").take_all()
    warnings.see_names(row["name"] for row in taken)
    for warning in warnings.new_warnings():
        progress.message(warning)
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
        num_cpus=actor_cpus(
            cpus, max(1, pending), config.worker_threads, config.tensor_parallel_size
        ),
        num_gpus=config.worker_gpus or None,
        batch_format="pyarrow",
    )
    for row in results.iter_rows():
        info = ShardInfo.from_json(row["info"])
        progress.message(
            f"shard {info.shard} done: {info.stats.input_rows} rows, "
            f"{info.prefix_groups} prefix groups, hit rate {info.stats.hit_rate:.3f}"
        )
