"""The model runner: one forward pass over a packed, ragged batch of scheduled work.

It owns the model's forward and the paged KV pool's tensors, and nothing about scheduling:
the scheduler hands it `ScheduledChunk`s (which tokens of which sequence to compute, at what
positions, into which pages) and gets back the next-token logits of the chunks that end at
their sequence's last known token.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.cache.kv_pool import KVPool
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
from astrai_batch.engine.runner.attention_batches import (
    block_batch,
    flash_block_batch,
    invariant_kernel_batch,
    kernel_batch,
    step_shaped_batch,
)
from astrai_batch.engine.runner.decode_graphs import DecodeGraphs, GraphSpec
from astrai_batch.engine.runner.forward_timer import ForwardTimer
from astrai_batch.engine.runner.invariant_plan import plan_numerics
from astrai_batch.engine.runner.logit_spans import span_rows
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.runner.step_buffers import StepBuffers
from astrai_batch.engine.vision.encoder_cache import (
    DEFAULT_ENCODER_CACHE_BYTES,
    EncoderCache,
    EncoderCounts,
)
from astrai_batch.engine.vision.image_spans import key_limits
from astrai_batch.engine.vision.tower import StepImages, VisionTower, step_embeddings


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
        # sliding windows, sinks, softcapping (`score_features`): the block attention, the
        # decode graphs' static attention and CUDA's Triton kernel apply all three, the CPU
        # flash kernel the first two; the paged kernels none (the engine leaves them out)
        self.features = score_features(model.config)
        if self.features.any and attention_kernel is not None:
            raise ValueError(f"the paged kernels do not apply {self.features.names()}")
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
        # the invariant scheme's GEMM rows, CPU flash rules and CUDA kernel (`invariant_plan`)
        plan = plan_numerics(
            model, attention_pool, numerics, query_heads, self.features, graphs, probe_results
        )
        self.gemm_rows, self.flash, self.invariant_kernel = plan
        # an image's placeholders attending to each other (Gemma 3): the CPU paths take each
        # query's last key (`image_spans.key_limits`, the C kernel's `key_ends`); CUDA's
        # Triton kernel counts keys only
        self.whole_images = vision is not None and vision.bidirectional_images
        kernel = self.invariant_kernel
        if (
            self.whole_images
            and kernel is not None
            and "key_ends" not in inspect.signature(kernel).parameters
        ):
            raise ValueError(
                "the CUDA invariant attention kernel cannot let an image's tokens attend to "
                "each other (Gemma 3): run this model on the CPU or with fast numerics"
            )
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
        images = rope = None
        if self.whole_images:
            step = step._replace(key_limits=key_limits(chunks, step.positions))
        if self.vision is not None:
            ids = torch.as_tensor(step.token_ids).to(self.device)
            images = step_embeddings(
                chunks,
                ids,
                self.model.get_input_embeddings(),
                self.encoder_cache,
                self.vision.image_token_id,
            )
            rope = self.vision.rope_positions(chunks)  # M-RoPE rows where images are in it
        if self.step_sender is not None:  # the other ranks group the rows by adapter alike
            self.step_sender.send_step(step, None if adapters is None else adapters[0])
        return self.forward_step(
            step,
            graphed=extra is None and images is None and rope is None,
            adapters=adapters,
            inputs_embeds=None if images is None else images.embeds,
            rope_positions=rope,
            deepstack=None if images is None or images.deepstack is None else images,
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
        rope_positions: np.ndarray | None = None,
        deepstack: StepImages | None = None,
    ) -> ForwardOutput:
        """The forward of a step's arrays (what a tensor-parallel rank receives).
        `adapters`: each chunk's LoRA adapter slot and token count, with adapters installed.
        `inputs_embeds`: the step's input embeddings, where images are in it (`vision`).
        `rope_positions`: [3, tokens] multimodal rotary positions (Qwen-VL), given to the
        model under the tokens' own positions as one [4, 1, tokens] tensor. `deepstack`: the
        step's image rows and DeepStack features (Qwen3-VL)."""
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
            if rope_positions is not None:
                rows = np.concatenate([step.positions[None], rope_positions])
                positions = self.staging.array(rows.astype(np.int64)).unsqueeze(1)
            else:
                positions = positions.unsqueeze(0)
            if deepstack is not None:
                inputs["visual_pos_masks"] = deepstack.visual_rows.unsqueeze(0)
                inputs["deepstack_visual_embeds"] = deepstack.deepstack
            outputs = self.model(
                **inputs,
                position_ids=positions,
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
            return flash_block_batch(
                step, pool, self.staging, self.gatherer, self.flash, window, self.use_cascade
            )
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
