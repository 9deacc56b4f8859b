"""Sizing and wiring an engine's parts: the attention backend, the KV pool, its layout and
the model runner, from the loaded model and the engine configuration.

The order matters: the backend and CUDA graphs are resolved with the model's real device and
dtype (the job checked the options before loading) before anything is allocated; the pool is
sized (an explicit page count, a memory budget, or the device's free memory after the
weights and a profiled activation peak, `memory_budget`) before the layout that hands out
its pages; a decode-graph scratch page is reserved from the layout before any request.
"""

from __future__ import annotations

from dataclasses import dataclass

from astrai_batch.cache import KVLayout, KVPool, make_layout
from astrai_batch.engine.attention.backends import resolve_attention_backend
from astrai_batch.engine.attention.kernels.factory import make_kernel
from astrai_batch.engine.attention.score_features import score_features
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.lora.bank import find_bank
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.runner.decode_graphs import GraphSpec, resolve_cuda_graphs
from astrai_batch.engine.runner.invariant_experts import has_experts
from astrai_batch.engine.runner.memory_budget import (
    capped,
    default_kv_budget,
    profile_activation_peak,
)
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.errors import ConfigError


@dataclass(frozen=True)
class EngineParts:
    max_model_len: int  # the model's context, capped by the configuration
    attention_backend: str  # the resolved one (never "auto")
    pool: KVPool
    cache: KVLayout
    runner: ModelRunner
    usable_pages: int  # pages requests can hold: the pool less the scratch page, if any


def local_query_heads(loaded: LoadedModel) -> int:
    """The query heads this process's attention computes: a tensor-parallel rank's share."""
    heads = int(loaded.model.config.num_attention_heads)
    return heads if loaded.parallel is None else heads // loaded.parallel.world_size


def assemble_engine(
    loaded: LoadedModel, config: EngineConfig, *, static_decode: bool = False
) -> EngineParts:
    parallel = loaded.parallel  # tensor parallelism: every rank assembles the same engine
    if parallel is not None:
        parallel.begin_engine(config, static_decode=static_decode)
    max_model_len = min(loaded.max_model_len, config.max_model_len or loaded.max_model_len)
    param = next(loaded.model.parameters())
    backend = resolve_attention_backend(
        config.attention_backend,
        device=param.device,
        numerics=config.numerics,
        page_size=config.page_size,
        dtype=param.dtype,
    )
    features = score_features(loaded.model.config)
    if features.any and backend != "sdpa":  # the paged kernels are not given them (yet)
        if config.attention_backend != "auto":
            raise ConfigError(
                f"--attention-backend {backend} cannot run this model: it does not apply "
                f"{features.names()}; use --attention-backend sdpa"
            )
        backend = "sdpa"
    if loaded.kv_latent and backend != "sdpa":  # the paged kernels read per-head pages
        if config.attention_backend != "auto":
            raise ConfigError(
                f"--attention-backend {backend} cannot run this model: its pages hold "
                "multi-head latent attention's latent, which the paged kernels do not read; "
                "use --attention-backend sdpa"
            )
        backend = "sdpa"
    capture = resolve_cuda_graphs(config.cuda_graphs, param.device, backend=backend)
    if loaded.kv_latent:  # the graphed decode reads per-head pages
        if config.cuda_graphs:
            raise ConfigError(
                "cuda_graphs cannot run this model: the graphed decode does not read multi-head "
                "latent attention's latent pages; use --no-cuda-graphs"
            )
        capture = static_decode = False
    capture = capture and parallel is None  # no graphs around the ranks' collectives (yet)
    if find_bank(loaded.model) is not None:
        # a graph replays fixed kernels: per-row adapter deltas run eagerly
        capture = static_decode = False
    if config.numerics == "invariant" and has_experts(loaded.model):
        # invariant experts size each expert's GEMMs on the host every step (`invariant_experts`)
        if config.cuda_graphs:
            raise ConfigError(
                "cuda_graphs cannot capture this model's mixture-of-experts layers under "
                "invariant numerics (each expert's rows are counted on the host every step); "
                "use --no-cuda-graphs"
            )
        capture = False
    pool_args = dict(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=config.page_size,
        dtype=param.dtype,
        device=param.device,
        latent=loaded.kv_latent,
    )
    if config.num_pages is not None:
        pool = KVPool(num_pages=config.num_pages, **pool_args)
    else:
        budget = config.kv_cache_memory
        if budget is None:
            page_args = {k: v for k, v in pool_args.items() if k != "device"}
            budget = capped(
                default_kv_budget(
                    param.device,
                    gpu_memory_utilization=config.gpu_memory_utilization,
                    profile_activation_peak=lambda: profile_activation_peak(
                        loaded.model,
                        pool_args,
                        max_num_batched_tokens=config.max_num_batched_tokens,
                        max_num_seqs=config.max_num_seqs,
                        max_model_len=max_model_len,
                        numerics=config.numerics,
                        graphs=capture,
                    ),
                ),
                bytes_per_page=KVPool.bytes_per_page(**page_args),
                max_num_seqs=config.max_num_seqs,
                pages_per_seq=-(-max_model_len // config.page_size),
            )
        pool = KVPool.from_memory_budget(budget, **pool_args)
        if parallel is not None:  # page ids are shared: every rank's pool has the fewest pages
            agreed = parallel.group.min_int(pool.num_pages)
            if agreed != pool.num_pages:
                pool = KVPool(num_pages=agreed, **pool_args)
    cache = make_layout(
        config.kv_layout,
        num_pages=pool.num_pages,
        page_size=config.page_size,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_prefix_cache=config.enable_prefix_cache,
    )
    graphs = None
    if capture or static_decode:
        graphs = GraphSpec(
            scratch_page=cache.reserve_scratch_page(),
            max_num_seqs=config.max_num_seqs,
            max_context=max_model_len,
            capture=capture,
        )
    runner = ModelRunner(
        loaded.model,
        pool,
        numerics=config.numerics,
        attention_kernel=make_kernel(backend, param.device),
        graphs=graphs,
        step_sender=None if parallel is None else parallel.sender,
        probe_results=loaded.probe_results,
        query_heads=local_query_heads(loaded),
        vision=loaded.vision,
        encoder_cache_bytes=config.encoder_cache_memory,
    )
    if capture:  # every bucket now, before the first step: none is captured mid-job
        runner.decode_graphs.capture_up_front()
    return EngineParts(
        max_model_len=max_model_len,
        attention_backend=backend,
        pool=pool,
        cache=cache,
        runner=runner,
        usable_pages=pool.num_pages - (graphs is not None),
    )
