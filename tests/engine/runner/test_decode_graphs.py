"""The CUDA-graph path for decode-only steps, run eagerly on CPU (capture aside, the same code).

The graph path pads a decode-only step to a bucket (batch size, context width), reads its
inputs from static tensors and attends with `static_decode`. With invariant numerics a real
row's logits must be bitwise the eager path's, whatever its bucket and padding: checked on
random decode steps (several buckets, mixed context lengths, shared prefix pages so the eager
path uses cascade runs), per attention call against `block_attention`, and over whole engine
runs (tokens and every sampled position's logits). On CUDA, capture + replay must equal the
same forward run eagerly.
"""

from __future__ import annotations

import random

import pytest
import torch
from invariance_kit import (
    GREEDY,
    SAMPLED,
    assert_same_rows,
    capture_rows,
    invariance_prompts,
    use_cuda_kernels_on_cpu,
)

from astrai_batch.cache import KVPool
from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.cache.manager import KVCacheManager
from astrai_batch.cache.seats import SeatTable
from astrai_batch.engine import EngineConfig, GenerationRequest
from astrai_batch.engine.attention.block_attention import block_attention
from astrai_batch.engine.attention.block_plan import (
    BlockBatch,
    QuerySpan,
    block_tokens_for,
    plan_blocks,
)
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.static_decode import StaticDecodeBatch, static_decode_attention
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.blas_rows import attention_row_scheme
from astrai_batch.engine.runner import invariant_plan
from astrai_batch.engine.runner.decode_graphs import GraphSpec, resolve_cuda_graphs
from astrai_batch.engine.runner.graph_buckets import GraphBuckets
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.errors import ConfigError

PAGE = 16
NUM_PAGES = 256
SCRATCH = 5  # any page no sequence holds


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


# -- buckets ---------------------------------------------------------------------------------


def test_buckets_follow_the_limits():
    buckets = GraphBuckets.for_limits(max_num_seqs=100, max_context=1000, block_tokens=64)
    assert buckets.batch_sizes == (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100)
    assert buckets.widths == (1, 2, 4, 8, 16)  # 1000 tokens are 16 blocks of 64
    assert GraphBuckets.for_limits(32, 64, 64) == GraphBuckets((1, 2, 4, 8, 16, 24, 32), (1,))
    assert GraphBuckets.for_limits(3, 200, 64) == GraphBuckets((1, 2, 3), (1, 2, 4))


def test_bucket_is_the_smallest_that_holds_the_step():
    buckets = GraphBuckets.for_limits(max_num_seqs=100, max_context=1000, block_tokens=64)
    assert buckets.select(1, 1) == (1, 1)
    assert buckets.select(3, 2) == (4, 2)
    assert buckets.select(5, 3) == (8, 4)
    assert buckets.select(33, 9) == (48, 16)
    assert buckets.select(100, 16) == (100, 16)
    assert buckets.select(101, 1) is None
    assert buckets.select(1, 17) is None


# -- the scratch page --------------------------------------------------------------------------


def test_scratch_page_is_never_handed_to_a_request():
    manager = KVCacheManager(num_pages=12, page_size=4)
    scratch = manager.reserve_scratch_page()
    assert manager.reserve_scratch_page() == scratch
    assert manager.allocator.refcount(scratch) == 1
    held = set()
    for rid in range(11):
        manager.open(rid, list(range(rid * 8, rid * 8 + 4)), 3)
        assert manager.reserve(rid, 4)
        held.update(manager.pages(rid))
    manager.open(11, [1000, 1001], 1)
    assert not manager.reserve(11, 2)  # 11 requests hold the 11 other pages
    assert scratch not in held and len(held) == 11
    manager.check_invariants()
    for rid in range(11):  # published, closed, cached, evicted for new requests: never it
        manager.close(rid, list(range(rid * 8, rid * 8 + 4)))
    assert manager.reserve(11, 2) and scratch not in manager.pages(11)
    manager.check_invariants()
    manager._requests[11].pages.append(scratch)  # what the invariant check must catch
    with pytest.raises(CacheUsageError, match=f"request 11 holds the scratch page {scratch}"):
        manager.check_invariants()


def test_contiguous_scratch_page_lies_past_every_seat():
    spare = SeatTable(num_pages=10, page_size=4, seat_tokens=16, max_seats=8)
    assert (spare.reserve_scratch_page(), spare.num_seats) == (8, 2)
    spare.check_invariants()
    full = SeatTable(num_pages=12, page_size=4, seat_tokens=16, max_seats=8)
    assert (full.reserve_scratch_page(), full.num_seats) == (8, 2)  # the third seat gave way
    assert full.reserve_scratch_page() == 8
    full.open("a", [1, 2], 1)
    full.open("b", [1, 2], 1)
    assert not full.can_open()
    full.check_invariants()
    alone = SeatTable(num_pages=4, page_size=4, seat_tokens=16, max_seats=8)
    with pytest.raises(ConfigError, match="room for one seat and no page besides it"):
        alone.reserve_scratch_page()


# -- configuration -----------------------------------------------------------------------------


def test_graphs_default_to_the_device_and_refuse_a_cpu():
    assert resolve_cuda_graphs(None, torch.device("cpu")) is False
    assert resolve_cuda_graphs(None, torch.device("cuda")) is True
    assert resolve_cuda_graphs(False, torch.device("cuda")) is False
    with pytest.raises(
        ConfigError, match=r"^cuda_graphs needs a CUDA device; the model is on cpu$"
    ):
        resolve_cuda_graphs(True, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"^cuda_graphs must be a bool or None, got str$"):
        EngineConfig(cuda_graphs="yes")


def test_engine_on_cpu_refuses_cuda_graphs(loaded):
    with pytest.raises(
        ConfigError, match=r"^cuda_graphs needs a CUDA device; the model is on cpu$"
    ):
        EngineCore(loaded, EngineConfig(num_pages=16, cuda_graphs=True))


# -- one attention call: static vs block_attention ----------------------------------------------


def random_decodes(rng: random.Random, count: int, longest: int, free_pages: list[int]):
    """(position, page table) per decode; about half share a prefix of whole blocks."""
    pages = iter(rng.sample(free_pages, len(free_pages)))
    shared = [next(pages) for _ in range(8)]  # 2 blocks of 4 pages
    decodes = []
    for _ in range(count):
        length = rng.randint(1, longest)
        needed = -(-length // PAGE)
        if length > 2 * 64 and rng.random() < 0.5:
            table = shared + [next(pages) for _ in range(needed - len(shared))]
        else:
            table = [next(pages) for _ in range(needed)]
        decodes.append((length - 1, table))
    return decodes


@pytest.mark.parametrize(("q_heads", "kv_heads"), [(2, 2), (4, 2), (6, 2)])
def test_static_attention_is_block_attention_bitwise(q_heads, kv_heads):
    torch.manual_seed(0)
    rng = random.Random(q_heads)
    dim, block = 8, block_tokens_for(PAGE)
    keys = [torch.randn(NUM_PAGES * PAGE, kv_heads, dim) * 3]
    values = [torch.randn(NUM_PAGES * PAGE, kv_heads, dim)]
    free = [p for p in range(NUM_PAGES) if p != SCRATCH]
    for count, blocks, padded in [(1, 1, 2), (3, 2, 4), (7, 4, 8), (5, 3, 16)]:
        decodes = random_decodes(rng, count, blocks * block, free)
        spans = [QuerySpan(i, pos, 1, table) for i, (pos, table) in enumerate(decodes)]
        runs, units = plan_blocks(spans, PAGE, True, HostStaging("cpu"))
        gatherer = PageGatherer()
        # the padding of small GEMMs the runner probes (two rows are not enough on every BLAS)
        rows = attention_row_scheme(dim, dim, block, 1024, torch.device("cpu"), torch.float32)
        eager = BlockBatch(
            keys, values, PAGE, block, torch.zeros(0), 0, runs, units, gatherer, rows
        )
        q = torch.randn(count, q_heads, dim)
        expected = block_attention(q, keys[0], values[0], eager, 0.3)
        width = blocks * (block // PAGE)
        tables = torch.zeros(padded, width, dtype=torch.long)
        positions = torch.zeros(padded, dtype=torch.long)
        tables[count:, 0] = SCRATCH
        for i, (pos, table) in enumerate(decodes):
            tables[i, : len(table)] = torch.tensor(table)
            positions[i] = pos
        static = StaticDecodeBatch(
            keys, values, PAGE, block, blocks, torch.zeros(padded), positions, tables, 0, True, rows
        )
        q_padded = torch.cat([q, torch.randn(padded - count, q_heads, dim)])
        got = static_decode_attention(q_padded, keys[0], values[0], static, 0.3)
        assert torch.equal(got[:count], expected), f"{count} decodes in a bucket of {padded}"
        assert bool(torch.isfinite(got).all())


# -- the runner: graph path (eager on CPU) vs the normal path -----------------------------------


def random_pool(loaded, device: str) -> KVPool:
    """A pool for the model whose every slot holds some earlier step's keys and values."""
    shape = {k: getattr(loaded, k) for k in ("num_layers", "num_kv_heads", "head_dim")}
    pool = KVPool(**shape, page_size=PAGE, num_pages=NUM_PAGES, dtype=torch.float32, device=device)
    torch.manual_seed(3)
    for cache in (*pool.key_cache, *pool.value_cache):
        cache.copy_(torch.randn_like(cache))
    return pool


class EagerSteps:
    """A graphed runner's own eager path: what its steps outside the buckets run (on the CPU
    an engine with decode graphs keeps the block attention, whose bits the graphs give; one
    without them may run invariant attention in the flash kernel instead)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def forward(self, chunks):
        return self.runner.forward_step(self.runner.buffers.build(chunks), graphed=False)


def runners(loaded, numerics: str, max_context: int = 512):
    pool = random_pool(loaded, "cpu")
    spec = GraphSpec(scratch_page=SCRATCH, max_num_seqs=32, max_context=max_context, capture=False)
    graphed = ModelRunner(loaded.model, pool, numerics=numerics, graphs=spec)
    return EagerSteps(graphed), graphed


def decode_chunks(rng: random.Random, count: int, longest: int, vocab: int, wants=None):
    free = [p for p in range(NUM_PAGES) if p != SCRATCH]
    return [
        ScheduledChunk([rng.randrange(vocab)], pos, table, True if wants is None else wants(i))
        for i, (pos, table) in enumerate(random_decodes(rng, count, longest, free))
    ]


def test_graph_path_logits_equal_the_eager_path_bitwise(loaded):
    eager, graphed = runners(loaded, "invariant")
    rng = random.Random(11)
    vocab = loaded.model.config.vocab_size
    for step, (count, longest) in enumerate([(1, 30), (3, 200), (6, 64), (9, 300), (17, 130)]):
        for _ in range(2):
            chunks = decode_chunks(rng, count, longest, vocab)
            expected = eager.forward(chunks).logits
            got = graphed.forward(chunks).logits
            assert torch.equal(got, expected), f"step {step}: {count} decodes up to {longest}"
    stats = graphed.decode_graphs.stats
    assert stats.graphed_steps == 10 and stats.captures == 0
    assert {batch for batch, _ in graphed.decode_graphs._entries} == {1, 4, 8, 16, 24}


def test_graph_path_returns_only_the_rows_that_want_logits(loaded):
    eager, graphed = runners(loaded, "invariant")
    rng = random.Random(12)
    chunks = decode_chunks(rng, 5, 150, loaded.model.config.vocab_size, wants=lambda i: i != 2)
    got = graphed.forward(chunks).logits
    assert got.shape[0] == 4
    assert torch.equal(got, eager.forward(chunks).logits)


def test_steps_outside_the_buckets_run_eagerly(loaded):
    eager, graphed = runners(loaded, "invariant", max_context=128)
    rng = random.Random(13)
    vocab = loaded.model.config.vocab_size
    long_context = [ScheduledChunk([7], 200, list(range(6, 6 + 13)), True)]  # > max_context
    prefill = [*decode_chunks(rng, 2, 100, vocab), ScheduledChunk([3, 4, 5], 0, [40], True)]
    for chunks in (long_context, prefill):
        assert torch.equal(graphed.forward(chunks).logits, eager.forward(chunks).logits)
    assert graphed.decode_graphs.stats.graphed_steps == 0


def test_a_sequence_in_the_scratch_page_is_refused(loaded):
    _, graphed = runners(loaded, "invariant")
    chunks = [ScheduledChunk([7], 20, [9, SCRATCH], True)]
    with pytest.raises(RuntimeError, match=f"^a sequence writes into the scratch page {SCRATCH}$"):
        graphed.forward(chunks)


def test_fast_numerics_graph_path_matches_closely(loaded):
    eager, graphed = runners(loaded, "fast")
    rng = random.Random(14)
    chunks = decode_chunks(rng, 6, 250, loaded.model.config.vocab_size)
    expected = eager.forward(chunks).logits
    got = graphed.forward(chunks).logits
    assert graphed.decode_graphs.stats.graphed_steps == 1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# -- whole engine runs ---------------------------------------------------------------------------


@pytest.fixture
def block_attention_everywhere(monkeypatch, loaded):
    """Engines without graphs run the block attention too, as on CUDA: the graphs' promise is
    the eager block attention's bits (a CPU engine without graphs may run invariant attention
    in the flash kernel, other bits, equally invariant: `test_flash_blocks`)."""
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda model, pool: None)
    loaded.probe_results.clear()
    yield
    loaded.probe_results.clear()


@pytest.mark.parametrize(
    ("layout", "budget", "num_pages"),
    [("paged", 256, 256), ("paged", 128, 40), ("contiguous", 256, 256)],
    ids=["paged", "paged-preempt", "contiguous"],
)
def test_engine_with_graph_path_gives_the_same_rows(
    loaded, block_attention_everywhere, layout, budget, num_pages
):
    prompts = invariance_prompts(loaded.model.config.vocab_size, 24, seed=8)
    requests = [
        GenerationRequest(i, prompts[i], SAMPLED if i % 2 else GREEDY) for i in range(len(prompts))
    ]
    config = EngineConfig(
        page_size=8,
        num_pages=num_pages,
        max_num_batched_tokens=budget,
        max_num_seqs=16,
        kv_layout=layout,
        max_model_len=256 if layout == "contiguous" else None,
    )
    plain = capture_rows(EngineCore(loaded, config), requests)
    core = EngineCore(loaded, config, static_decode=True)
    graphed = capture_rows(core, requests)
    assert_same_rows(plain, graphed, range(len(prompts)))
    assert core.runner.decode_graphs.stats.graphed_steps > 0
    if num_pages == 40:
        assert core.stats().preemptions > 0


@pytest.mark.long  # Triton interpreted on CPU: minutes (the kernel: tests/engine/attention)
def test_graph_path_calls_the_eager_steps_cuda_kernel(tiny_llama_dir, monkeypatch):
    """With CUDA's invariant attention (Triton, interpreted here) the graphed decode calls the
    eager steps' kernel, at the bucket's padded shape: the same rows."""
    use_cuda_kernels_on_cpu(monkeypatch)
    loaded = load_model(tiny_llama_dir)
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=8)
    requests = [
        GenerationRequest(i, prompts[i], SAMPLED if i % 2 else GREEDY) for i in range(len(prompts))
    ]
    config = EngineConfig(page_size=8, num_pages=64, max_num_seqs=8)
    plain = capture_rows(EngineCore(loaded, config, invariance_probe=False), requests)
    core = EngineCore(loaded, config, static_decode=True, invariance_probe=False)
    assert core.runner.decode_graphs.invariant_kernel is not None
    assert_same_rows(plain, capture_rows(core, requests), range(len(prompts)))
    assert core.runner.decode_graphs.stats.graphed_steps > 0


@pytest.mark.slow
def test_smollm2_with_graph_path_gives_the_same_rows(monkeypatch):
    monkeypatch.setattr(invariant_plan, "_flash_rules", lambda model, pool: None)
    smollm2 = load_model("smollm2-135m")  # 9 query heads on 3 KV heads, head size 64
    prompts = invariance_prompts(smollm2.model.config.vocab_size, 12, seed=9)
    requests = [
        GenerationRequest(i, prompts[i], SAMPLED if i % 2 else GREEDY) for i in range(len(prompts))
    ]
    config = EngineConfig(page_size=16, num_pages=256, max_num_seqs=12)
    plain = capture_rows(EngineCore(smollm2, config), requests)
    core = EngineCore(smollm2, config, static_decode=True)
    assert_same_rows(plain, capture_rows(core, requests), range(len(prompts)))
    assert core.runner.decode_graphs.stats.graphed_steps > 0


# -- CUDA: capture + replay ------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_graphs_replay_the_eager_static_forward(tiny_model_dir):
    cuda = load_model(tiny_model_dir, device="cuda")
    pool = random_pool(cuda, "cuda")
    spec = GraphSpec(scratch_page=SCRATCH, max_num_seqs=32, max_context=512, capture=True)
    captured = ModelRunner(cuda.model, pool, graphs=spec)
    eager = ModelRunner(cuda.model, pool, graphs=GraphSpec(SCRATCH, 32, 512, capture=False))
    rng = random.Random(21)
    for count, longest in [(1, 30), (1, 30), (3, 200), (9, 300), (17, 130)]:
        chunks = decode_chunks(rng, count, longest, cuda.model.config.vocab_size)
        replayed = captured.forward(chunks).logits.clone()
        assert torch.equal(replayed, eager.forward(chunks).logits)
    stats = captured.decode_graphs.stats
    assert stats.failure is None
    assert stats.graphed_steps == 5 and 0 < stats.captures <= 4  # (1, 1) is replayed


@pytest.mark.parametrize(
    ("requested", "device", "backend", "expected"),
    [
        (None, "cuda", "sdpa", True),
        (None, "cuda", "flashinfer", False),  # the kernels are planned on the host per step
        (None, "cuda", "flash-attn", False),
        (None, "cpu", "sdpa", False),
        (False, "cuda", "sdpa", False),
        (True, "cuda", "sdpa", True),
    ],
)
def test_graphs_default_on_only_where_the_backend_can_be_captured(
    requested: bool | None, device: str, backend: str, expected: bool
) -> None:
    assert resolve_cuda_graphs(requested, torch.device(device), backend=backend) is expected


def test_graphs_asked_for_with_a_kernel_backend_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_cuda_graphs(True, torch.device("cuda"), backend="flash-attn")
    assert str(caught.value) == (
        "cuda_graphs cannot be used with attention backend flash-attn (its step metadata is "
        "planned on the host every step); use --attention-backend sdpa or --no-cuda-graphs"
    )
