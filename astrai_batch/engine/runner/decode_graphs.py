"""CUDA graphs for decode-only steps: static inputs, bucketed shapes, capture and replay.

On a GPU a decode step of a small model is a few hundred short kernels; launching them one by
one from Python costs more than running them. A CUDA graph records the launches once and
replays them with one call. It replays fixed shapes reading fixed addresses, so:

- the step's inputs (token ids, positions, write slots, page tables) live in one persistent
  int64 device tensor, updated in place before each replay by one non-blocking copy from a
  pinned host staging tensor of the same layout (on CPU the two are one tensor);
- a decode-only step (every chunk one new token) is padded to its bucket (`graph_buckets`):
  padding rows read token 0 at position 0 and write their keys and values into the *scratch
  page*, a page the KV layout reserved for this (`reserve_scratch_page`) and never hands to a
  sequence; their logits are dropped;
- attention is `static_decode` (fixed shapes, no host synchronization); with invariant
  numerics it gives a row the bits the eager path gives it (on CUDA by calling the eager
  path's own Triton kernel), so a row's tokens never depend on whether its step was graphed
  or on its bucket;
- each bucket is captured lazily, on its first step (after two warm-up runs on a side
  stream), into one graph memory pool shared by all buckets (graphs replay one at a time on
  one stream, so their temporaries may overlap); every graph copies its logits into one
  static [max batch, vocab] buffer, so the buckets do not each keep their own.

Steps with a prefill chunk, or larger than the largest bucket, run the eager path. With
`capture=False` the same static forward runs eagerly at the same padded shapes: that is how
the CPU tests check everything except the capture itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.backends import BACKEND_SPECS
from astrai_batch.engine.attention.block_plan import block_tokens_for
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.paged_attention import BATCH_KWARG
from astrai_batch.engine.attention.static_decode import StaticDecodeBatch
from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO, RowScheme
from astrai_batch.engine.runner.forward_timer import ForwardTimer
from astrai_batch.engine.runner.graph_buckets import GraphBuckets
from astrai_batch.errors import ConfigError

_LOG = logging.getLogger(__name__)
# a step of no rows: staging it fills a bucket's inputs with padding rows only
_NONE = np.zeros(0, dtype=np.int64)
_EMPTY_STEP = StepArrays(*[_NONE] * 7, np.zeros((0, 0), dtype=np.int64), _NONE, 0)
WARMUP_RUNS = 2  # lazy initializations (cuBLAS handles, workspaces) happen outside the graph
INPUT_ROWS = 3  # token ids, positions, write slots; then the page tables


@dataclass(frozen=True)
class GraphSpec:
    """How the runner runs decode-only steps at bucketed shapes."""

    scratch_page: int  # reserved by the KV layout for the padding rows' keys and values
    max_num_seqs: int
    max_context: int  # the longest sequence the engine allows (prompt + output)
    capture: bool  # True: CUDA graphs; False: the same static forward, run eagerly


@dataclass
class GraphStats:
    captures: int = 0
    capture_seconds: float = 0.0
    graphed_steps: int = 0  # decode-only steps run at a bucket's shape (replayed or eager)
    failure: str | None = None  # why capture was given up (every step then runs eagerly)


def resolve_cuda_graphs(
    requested: bool | None, device: torch.device, *, backend: str = "sdpa"
) -> bool:
    """None: on exactly when the model is on CUDA and the attention backend can be captured;
    True elsewhere is a configuration error."""
    capturable = BACKEND_SPECS[backend].cuda_graphs
    if requested is None:
        return device.type == "cuda" and capturable
    if requested and device.type != "cuda":
        raise ConfigError(f"cuda_graphs needs a CUDA device; the model is on {device.type}")
    if requested and not capturable:
        raise ConfigError(
            f"cuda_graphs cannot be used with attention backend {backend} (its step metadata "
            "is planned on the host every step); use --attention-backend sdpa or "
            "--no-cuda-graphs"
        )
    return requested


class DecodeGraphs:
    """Decode-only steps at bucketed shapes, captured as CUDA graphs (or run eagerly)."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        spec: GraphSpec,
        *,
        invariant: bool,
        gemm_rows: RowScheme = ROWS_AT_LEAST_TWO,
        staging: HostStaging | None = None,
        invariant_kernel: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        self.device = pool.key_cache[0].device
        self.staging = HostStaging(self.device) if staging is None else staging
        if spec.capture and self.device.type != "cuda":
            raise ConfigError(f"CUDA graphs need a CUDA device; the pool is on {self.device.type}")
        if not 0 <= spec.scratch_page < pool.num_pages:
            raise ValueError(f"scratch page {spec.scratch_page} is outside the pool")
        self.model = model
        self.pool = pool
        self.spec = spec
        self.invariant = invariant
        self.gemm_rows = gemm_rows
        self.invariant_kernel = invariant_kernel  # the eager path's, on CUDA
        self.page_size = pool.page_size
        self.block_tokens = block_tokens_for(pool.page_size)
        self.pages_per_block = self.block_tokens // pool.page_size
        self.buckets = GraphBuckets.for_limits(
            spec.max_num_seqs, spec.max_context, self.block_tokens
        )
        size = self._input_size(self.buckets.max_batch, self.buckets.max_width)
        self._inputs = torch.zeros(size, dtype=torch.long, device=self.device)
        self._copied: torch.cuda.Event | None = None
        if self.device.type == "cuda":
            self._staging = torch.zeros(size, dtype=torch.long, pin_memory=True)
            self._copied = torch.cuda.Event()
        else:
            self._staging = self._inputs
        self._host = self._staging.numpy()
        self._entries: dict[tuple[int, int], Callable[[], torch.Tensor]] = {}
        self._graph_pool = None
        self._logits: torch.Tensor | None = None  # the graphs' static output
        self.stats = GraphStats()

    def stage(self, step: StepArrays) -> Callable[[ForwardTimer], torch.Tensor] | None:
        """Host work for a bucketed decode step: its inputs staged (and its bucket's graph
        captured on first use); returns the forward to run (logits of the step's logit rows),
        or None when the step is not a decode-only step that a bucket holds."""
        rows = len(step.num_tokens)
        if len(step.token_ids) != rows or self.stats.failure is not None:
            return None
        longest = int(step.positions.max()) + 1
        bucket = self.buckets.select(rows, -(-longest // self.block_tokens))
        if bucket is None:
            return None
        self._stage(step, *bucket)
        run = self._entries.get(bucket)
        if run is None:
            if self.spec.capture:  # not captured up front: this step runs eagerly
                return None
            run = self._prepare(*bucket)
        wanted = None if len(step.logit_rows) == rows else self.staging.array(step.logit_rows)

        def forward(timer: ForwardTimer) -> torch.Tensor:
            timer.start()
            logits = run()
            timer.stop()
            self.stats.graphed_steps += 1
            return logits[:rows] if wanted is None else logits.index_select(0, wanted)

        return forward

    def capture_up_front(self, progress: Callable[[str], None] = _LOG.info) -> None:
        """Captures every bucket of `GraphBuckets.capture_order` before the first step (with
        a progress line per tenth); a failure leaves every step eager (`stats.failure`)."""
        order = self.buckets.capture_order()
        tenth = max(1, len(order) // 10)
        for done, (batch, width) in enumerate(order, start=1):
            self._stage(_EMPTY_STEP, batch, width)  # padding rows only: the scratch page
            if self._prepare(batch, width) is None:
                progress(f"CUDA graphs: capture failed ({self.stats.failure}); running eagerly")
                return
            if done % tenth == 0 or done == len(order):
                progress(
                    f"CUDA graphs: captured {done}/{len(order)} buckets in "
                    f"{self.stats.capture_seconds:.1f} s"
                )

    # -- static inputs -----------------------------------------------------------------------

    def _input_size(self, batch: int, width: int) -> int:
        return batch * (INPUT_ROWS + width * self.pages_per_block)

    def _stage(self, step: StepArrays, batch: int, width: int) -> None:
        """Writes the step, padded to (batch, width), into the static inputs."""
        n = len(step.num_tokens)
        pages = width * self.pages_per_block
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has read the staging
        host = self._host
        scratch = self.spec.scratch_page
        if (step.write_slots // self.page_size == scratch).any():
            # padding rows write there too: a sequence holding it would read their keys
            raise RuntimeError(f"a sequence writes into the scratch page {scratch}")
        for index, (values, pad) in enumerate(
            ((step.token_ids, 0), (step.positions, 0), (step.write_slots, scratch * self.page_size))
        ):
            part = host[index * batch : (index + 1) * batch]
            part[:n] = values
            part[n:] = pad
        tables = host[INPUT_ROWS * batch : INPUT_ROWS * batch + batch * pages].reshape(batch, pages)
        held = step.page_tables.shape[1]
        tables[:n, :held] = step.page_tables
        tables[:n, held:] = 0
        tables[n:] = 0
        tables[n:, 0] = scratch  # a padding row's one key: its own, in the scratch page
        size = self._input_size(batch, width)
        self.staging.into(self._inputs[:size], self._staging[:size])
        if self._copied is not None:
            self._copied.record()

    def _views(self, batch: int, width: int):
        flat = self._inputs
        ids, positions, slots = (flat[i * batch : (i + 1) * batch] for i in range(INPUT_ROWS))
        pages = width * self.pages_per_block
        start = INPUT_ROWS * batch
        tables = flat[start : start + batch * pages].view(batch, pages)
        return ids, positions, slots, tables

    # -- the bucket's forward ----------------------------------------------------------------

    def _prepare(self, batch: int, width: int) -> Callable[[], torch.Tensor] | None:
        ids, positions, slots, tables = self._views(batch, width)
        token_rows = token_keys = None
        if self.invariant_kernel is not None:  # row i's pages are row i; its keys, forward's
            token_rows = torch.arange(batch, device=self.device, dtype=torch.int32)
            token_keys = torch.empty_like(positions)
        attention = StaticDecodeBatch(
            key_cache=self.pool.key_cache,
            value_cache=self.pool.value_cache,
            page_size=self.page_size,
            block_tokens=self.block_tokens,
            num_blocks=width,
            write_slots=slots,
            positions=positions,
            page_tables=tables,
            longest_context=min(width * self.block_tokens, self.spec.max_context),
            invariant=self.invariant,
            gemm_rows=self.gemm_rows,
            invariant_kernel=self.invariant_kernel,
            token_rows=token_rows,
            token_keys=token_keys,
        )

        def forward() -> torch.Tensor:
            if token_keys is not None:  # once per step, not per layer
                torch.add(positions, 1, out=token_keys)
            outputs = self.model(
                input_ids=ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=0,
                **{BATCH_KWARG: attention},
            )
            return outputs.logits[0].float()

        run = self._capture(forward, batch) if self.spec.capture else forward
        if run is not None:
            self._entries[(batch, width)] = run
        return run

    def _capture(self, forward: Callable[[], torch.Tensor], batch: int):
        """The bucket's graph, or None (and every later step eager) when capture fails.

        The warm-up runs compute the current step for real: they write the same keys and
        values into the same slots as the replay that follows, so running twice is harmless.
        """
        started = time.perf_counter()
        device = self.device
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    warm = forward()
            torch.cuda.current_stream(device).wait_stream(side)
            if self._logits is None:
                shape = (self.buckets.max_batch, warm.shape[-1])
                self._logits = torch.empty(shape, dtype=torch.float32, device=device)
            del warm
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            target = self._logits[:batch]
            # thread_local: the engine steps in a worker thread; others (tokenizing, writing,
            # grammar masks) may run meanwhile and must not void the capture
            with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
                target.copy_(forward())
        except RuntimeError as exc:
            self.stats.failure = str(exc).strip().splitlines()[0] if str(exc).strip() else "?"
            torch.cuda.synchronize(device)
            return None
        self.stats.captures += 1
        self.stats.capture_seconds += time.perf_counter() - started

        def replay() -> torch.Tensor:
            graph.replay()
            return target

        return replay
