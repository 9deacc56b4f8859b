"""The model runner: one forward pass over a packed, ragged batch of scheduled work.

It owns the model's forward and the paged KV pool's tensors, and nothing about scheduling:
the scheduler hands it `ScheduledChunk`s (which tokens of which sequence to compute, at what
positions, into which pages) and gets back the next-token logits of the chunks that end at
their sequence's last known token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.block_plan import (
    RUN_SEGMENT_BLOCKS,
    block_tokens_for,
)
from astrai_batch.engine.attention.flash_block_types import KEY_BLOCK, FlashRules
from astrai_batch.engine.attention.flash_probe import invariant_tails
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.kernels.interface import PagedKernel
from astrai_batch.engine.attention.latent_pages import LatentPages
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.paged_attention import (
    ATTENTION_NAME,
    BATCH_KWARG,
    register_paged_attention,
)
from astrai_batch.engine.attention.score_features import WindowPlans, score_features
from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.lora.bank import find_bank
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO, attention_row_scheme
from astrai_batch.engine.runner.attention_batches import (
    block_batch,
    flash_block_batch,
    invariant_kernel_batch,
    kernel_batch,
    step_shaped_batch,
)
from astrai_batch.engine.runner.decode_graphs import DecodeGraphs, GraphSpec
from astrai_batch.engine.runner.forward_timer import ForwardTimer
from astrai_batch.engine.runner.invariant_cuda import invariant_cuda_ops, runnable
from astrai_batch.engine.runner.invariant_experts import set_expert_tiling
from astrai_batch.engine.runner.invariant_linear import (
    gemm_shapes,
    row_schemes_for,
    set_row_tiling,
)
from astrai_batch.engine.runner.invariant_norms import set_norm_tiling
from astrai_batch.engine.runner.linear_check import refuse_variant_linears
from astrai_batch.engine.runner.logit_spans import span_rows
from astrai_batch.engine.runner.step_buffers import StepBuffers
from astrai_batch.engine.vision.encoder_cache import (
    DEFAULT_ENCODER_CACHE_BYTES,
    EncoderCache,
    EncoderCounts,
)
from astrai_batch.engine.vision.tower import VisionTower, step_embeddings


class ScheduledChunk(NamedTuple):
    """Compute `token_ids` at positions [start, start + len) of one sequence.

    A named tuple, not a dataclass: a step makes one per scheduled sequence, and a frozen
    dataclass's field-by-field `__init__` cost a few microseconds each at 256 sequences.
    """

    token_ids: Sequence[int]
    start: int
    pages: Sequence[int]  # the sequence's page table, covering at least start + len tokens
    wants_logits: bool  # the chunk ends at the sequence's last known token
    # The sequence and its page table's version (`KVCacheManager.pages_version`): the runner
    # keeps the table between steps and rewrites it only when the version changes. None: the
    # table is written for this step only.
    seq_key: Hashable | None = None
    pages_version: int | None = None
    adapter: int = 0  # the sequence's LoRA adapter slot (`lora.bank`); 0: the base model
    # rows [first, stop) of this chunk whose logits are wanted besides the sampling row
    # (prompt positions: `engine.sampling.prompt_logprobs`); they come after every sampling
    # row in `ForwardOutput.logits`, in chunk order
    logit_span: tuple[int, int] | None = None
    # the sequence's images (`engine.vision.image_inputs.ImageInput`): the runner puts their
    # features at the placeholder positions this chunk covers
    images: tuple = ()


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [number of chunks with wants_logits, vocab], float32
    timer: ForwardTimer

    @property
    def forward_seconds(self) -> float:
        """The model's time (device time on CUDA: read after the step's sync, it costs none)."""
        return self.timer.seconds()


NUMERICS = ("invariant", "fast")


class ModelRunner:
    """numerics="invariant": a row's logits never depend on the rest of the step (row-tiled
    linear layers; attention in fixed 512-key blocks in torch's CPU flash kernel where its
    probe passes, on CUDA one Triton program per query token with norms reduced per row
    (`invariant_cuda_ops`), else block-ordered attention); "fast": the step-shaped kernels, or
    a paged CUDA kernel (`attention_kernel`, see `kernel_attention`) for the step's attention.
    `graphs`: decode-only steps run at bucketed shapes (`decode_graphs`), captured or eagerly."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        *,
        use_cascade: bool = True,
        numerics: str = "invariant",
        attention_kernel: PagedKernel | None = None,
        graphs: GraphSpec | None = None,
        step_sender=None,
        probe_results: dict | None = None,
        query_heads: int | None = None,
        vision: VisionTower | None = None,
        encoder_cache_bytes: int = DEFAULT_ENCODER_CACHE_BYTES,
    ) -> None:
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
        if attention_kernel is not None and numerics != "fast":
            raise ValueError("an attention kernel does not keep invariant numerics: use 'fast'")
        # sliding windows, sinks, softcapping (`score_features`): the block attention and
        # CUDA's Triton kernel apply all three, the CPU flash kernel the first two; the
        # decode graphs and the paged kernels none (the engine leaves them out for such models)
        self.features = score_features(model.config)
        if self.features.any and (graphs is not None or attention_kernel is not None):
            raise ValueError(
                f"decode graphs and paged kernels do not apply {self.features.names()}"
            )
        # this process's query heads: a tensor-parallel rank holds 1/N of the model's, and
        # its attention's rows (and the probes that plan them) are its own heads only
        if query_heads is None:
            query_heads = model.config.num_attention_heads
        register_paged_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        # multi-head latent attention over latent pages: the plans and probes see the step's
        # expanded keys and values (`latent_pages`), never the latent pool itself
        self.latent: LatentPages | None = None
        attention_pool = pool
        if pool.latent:
            if graphs is not None or attention_kernel is not None:
                raise ValueError("decode graphs and paged kernels do not read latent pages")
            self.latent = LatentPages(model, pool.key_cache, pool.page_size, query_heads)
            attention_pool = self.latent.expanded
        self.attention_pool = attention_pool
        # the BLAS's invariant GEMM row counts, probed once (raises where there are none)
        self.gemm_rows = ROWS_AT_LEAST_TWO
        # the flash kernel's invariant shapes when invariant attention runs in it (the CPU)
        self.flash: FlashRules | None = None
        self.invariant_kernel = None  # CUDA's invariant attention (`invariant_triton`)
        if numerics == "invariant":
            refuse_variant_linears(model)  # quantized layers: invariant, or refused
            memo = {} if probe_results is None else probe_results
            param = next(model.parameters())
            where = (torch.get_num_threads(), param.device.type, param.dtype)
            shapes = tuple(gemm_shapes(model))
            # raises where no scheme exists
            scheme = _probed(memo, ("linear rows", shapes, where), lambda: row_schemes_for(model))
            set_row_tiling(model, True, scheme)
            set_expert_tiling(model, True, scheme)  # MoE: each expert's GEMM, the router's
            heads = (*_heads_key(query_heads, attention_pool), where)
            # CUDA: attention and norm reductions in a construction-fixed order (Triton)
            ops = invariant_cuda_ops(param.device)
            if ops[0] is not None:
                ops = _probed(
                    memo,
                    ("triton", heads),
                    lambda: runnable(ops, model, attention_pool, query_heads),
                )
            self.invariant_kernel, mean_squares = ops
            if mean_squares is not None or param.device.type != "cpu":
                set_norm_tiling(model, True, mean_squares)
            flash_fits = self.features.softcap is None  # the flash kernel cannot softcap
            if graphs is None and self.invariant_kernel is None and flash_fits:
                self.flash = _probed(
                    memo, ("flash", heads), lambda: _flash_rules(query_heads, attention_pool)
                )
            if self.flash is None and self.invariant_kernel is None:
                key = ("block attention rows", heads)
                self.gemm_rows = _probed(
                    memo, key, lambda: _attention_rows(query_heads, attention_pool)
                )
        else:
            set_row_tiling(model, False)
            set_expert_tiling(model, False)
            set_norm_tiling(model, False)
        self.numerics = numerics
        # tensor parallelism, rank 0: each step's arrays go to the other ranks (`parallel`)
        self.step_sender = step_sender
        self.model = model
        self.pool = pool
        self.device = pool.key_cache[0].device
        self.page_size = pool.page_size
        self.use_cascade = use_cascade
        self.attention_kernel = attention_kernel
        self.gatherer = PageGatherer()
        self.staging = HostStaging(self.device)  # every per-step host-to-device copy
        self.buffers = StepBuffers(self.page_size)
        self.lora = find_bank(model)  # None: no adapters installed
        # a vision-language model's tower and its features by image content (`engine.vision`)
        self.vision = vision
        self.encoder_cache = (
            None if vision is None else EncoderCache(vision.encode, encoder_cache_bytes)
        )
        self.decode_graphs = (
            None
            if graphs is None
            else DecodeGraphs(
                model,
                pool,
                graphs,
                invariant=numerics == "invariant",
                gemm_rows=self.gemm_rows,
                staging=self.staging,
                invariant_kernel=self.invariant_kernel,
            )
        )

    @torch.inference_mode()
    def forward(self, chunks: Sequence[ScheduledChunk]) -> ForwardOutput:
        if not chunks:
            raise ValueError("forward needs at least one chunk")
        step = self.buffers.build(chunks)
        extra = span_rows(chunks, step.token_start)
        if extra is not None:  # prompt positions' logits (`logit_spans`): never graphed
            step = step._replace(logit_rows=np.concatenate([step.logit_rows, extra]))
        adapters = None
        if self.lora is not None:
            adapters = ([c.adapter for c in chunks], [len(c.token_ids) for c in chunks])
        embeds = None
        if self.vision is not None:
            ids = torch.as_tensor(step.token_ids).to(self.device)
            embeds = step_embeddings(
                chunks,
                ids,
                self.model.get_input_embeddings(),
                self.encoder_cache,
                self.vision.image_token_id,
            )
        if self.step_sender is not None:  # the other ranks group the rows by adapter alike
            self.step_sender.send_step(step, None if adapters is None else adapters[0])
        return self.forward_step(
            step, graphed=extra is None and embeds is None, adapters=adapters, inputs_embeds=embeds
        )

    def encoder_counts(self) -> EncoderCounts:
        """Images encoded and encodes saved so far (zeros for a text model)."""
        return EncoderCounts() if self.encoder_cache is None else self.encoder_cache.counts

    @torch.inference_mode()
    def forward_step(
        self,
        step: StepArrays,
        *,
        graphed: bool = True,
        adapters: tuple[list[int], list[int]] | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> ForwardOutput:
        """The forward of a step's arrays (what a tensor-parallel rank receives).
        `adapters`: each chunk's LoRA adapter slot and token count, with adapters installed.
        `inputs_embeds`: the step's input embeddings, where images are in it (`vision`)."""
        built = self._build_batch(step, graphed)
        timer = ForwardTimer(self.device)
        if callable(built):  # a decode-only step staged for its bucket's graph
            return ForwardOutput(logits=built(timer), timer=timer)
        batch, input_ids, positions, logit_rows = built
        lora = self.lora if adapters is not None else None
        if lora is not None:
            lora.begin_step(*adapters, invariant=self.numerics == "invariant", device=self.device)
        timer.start()
        try:
            if self.latent is not None:
                self.latent.begin(*batch.latent_arrays)
                batch = batch.plan
            inputs = (
                {"input_ids": input_ids.unsqueeze(0)}
                if inputs_embeds is None
                else {"inputs_embeds": inputs_embeds.unsqueeze(0)}
            )
            outputs = self.model(
                **inputs,
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=logit_rows,
                **{BATCH_KWARG: batch},
            )
        finally:
            if lora is not None:
                lora.end_step()
            if self.latent is not None:
                self.latent.end()
        logits = outputs.logits[0].float()
        timer.stop()
        return ForwardOutput(logits=logits, timer=timer)

    def _build_batch(self, step: StepArrays, graphed: bool = True):
        if graphed and self.decode_graphs is not None:
            staged = self.decode_graphs.stage(step)
            if staged is not None:
                return staged
        stage = self.staging.array
        input_ids = stage(step.token_ids)
        position_ids = stage(step.positions)
        rows = stage(step.logit_rows)
        latent_arrays = None
        if self.latent is not None:  # planned over the step's own pages, expanded per layer
            step, pages, write_slots = self.latent.localize(step)
            latent_arrays = (stage(pages), stage(write_slots))
        batch = self._attention_batch(step)
        if self.features.window is not None and self.invariant_kernel is None:
            # each layer's plan by its window (the Triton kernel takes it per call)
            batch = WindowPlans(batch, lambda window: self._attention_batch(step, window))
        if latent_arrays is not None:
            batch = LatentStep(batch, latent_arrays)
        return batch, input_ids, position_ids, rows

    def _attention_batch(self, step: StepArrays, window: int | None = None):
        """The step's plan for full attention, or for a sliding window's layers."""
        pool = self.attention_pool
        if self.invariant_kernel is not None:
            return invariant_kernel_batch(step, pool, self.staging, self.invariant_kernel)
        if self.flash is not None:
            return flash_block_batch(step, pool, self.staging, self.gatherer, self.flash, window)
        features = self.features
        if (
            self.numerics == "invariant"
            or window is not None
            or features.sinks
            or features.softcap is not None
        ):  # fast numerics too: the step-shaped SDPA applies no window, sink or softcap
            return block_batch(
                step,
                pool,
                self.staging,
                self.gatherer,
                use_cascade=self.use_cascade,
                gemm_rows=self.gemm_rows,
                window=window,
            )
        if self.attention_kernel is not None:
            return kernel_batch(step, pool, self.staging, self.attention_kernel)
        return step_shaped_batch(
            step, pool, self.staging, self.gatherer, use_cascade=self.use_cascade
        )


class LatentStep(NamedTuple):
    """A latent-page step: its attention plan and (the step's pages, the new tokens' pool
    slots), handed to `LatentPages.begin` before the forward."""

    plan: object
    latent_arrays: tuple[torch.Tensor, torch.Tensor]


def _heads_key(query_heads: int, pool: KVPool) -> tuple:
    """The attention shapes a probe result holds for."""
    heads = (query_heads, *pool.key_cache[0].shape[1:])
    return (*heads, pool.value_cache[0].shape[-1], pool.page_size)


def _probed(memo: dict, key: tuple, probe):
    """`probe()`'s result, run once per key of the loaded model's memo."""
    if key not in memo:
        memo[key] = probe()
    return memo[key]


def _flash_rules(query_heads: int, pool: KVPool) -> FlashRules | None:
    """Where invariant attention can run in torch's CPU flash kernel (`flash_blocks`): on the
    CPU, equal key and value sizes, and the probe passing; else None. (Not with decode graphs
    either: their fixed-shape attention gives the block attention's bits.)"""
    key, value = pool.key_cache[0], pool.value_cache[0]
    kv_heads, head_dim = key.shape[1:]
    whole_pages = KEY_BLOCK % pool.page_size == 0  # a query's blocks are whole pages
    if key.device.type != "cpu" or value.shape[-1] != head_dim or not whole_pages:
        return None
    try:
        tails = invariant_tails(head_dim, kv_heads, key.dtype)
    except RuntimeError:  # the kernel does not take this dtype or head size here
        return None
    if tails is None:
        return None
    return FlashRules(group=query_heads // kv_heads, tails=tails)


def _attention_rows(query_heads: int, pool: KVPool):
    """The block attention's GEMM row scheme, probed up to its largest GEMM: a prefill run
    segment's rows or 1024 cascade members, times the query heads per KV head (this rank's
    query heads over its KV heads)."""
    kv_heads, head_dim = pool.key_cache[0].shape[1:]
    group = query_heads // kv_heads
    block = block_tokens_for(pool.page_size)
    max_rows = group * max(RUN_SEGMENT_BLOCKS * block, 1024)
    value_dim = pool.value_cache[0].shape[-1]
    return attention_row_scheme(
        head_dim, value_dim, block, max_rows, pool.key_cache[0].device, pool.key_cache[0].dtype
    )
