"""Which decode-graph buckets are captured up front, and in which order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_batch.cache import KVPool
from astrai_batch.engine.runner.decode_graphs import _EMPTY_STEP, DecodeGraphs, GraphSpec
from astrai_batch.engine.runner.graph_buckets import MAX_CAPTURED, GraphBuckets


def test_every_bucket_is_captured_largest_first_when_few() -> None:
    buckets = GraphBuckets.for_limits(max_num_seqs=4, max_context=128, block_tokens=64)
    assert buckets.batch_sizes == (1, 2, 4) and buckets.widths == (1, 2)
    assert buckets.capture_order() == [(4, 2), (4, 1), (2, 2), (2, 1), (1, 2), (1, 1)]


def test_many_buckets_keep_the_smallest_captured_largest_first() -> None:
    buckets = GraphBuckets.for_limits(max_num_seqs=256, max_context=8192, block_tokens=64)
    every = len(buckets.batch_sizes) * len(buckets.widths)
    assert every == 21 * 8 > MAX_CAPTURED
    order = buckets.capture_order()
    assert len(order) == MAX_CAPTURED == len(set(order))
    areas = [b * w for b, w in order]
    assert areas == sorted(areas, reverse=True)
    # the cap drops only buckets larger than every kept one
    dropped = set((b, w) for b in buckets.batch_sizes for w in buckets.widths) - set(order)
    assert min(b * w for b, w in dropped) >= max(areas)
    assert order[-1] == (1, 1) and (256, 128) not in order
    assert buckets.capture_order(cap=3) == [(2, 1), (1, 2), (1, 1)]
    with pytest.raises(ValueError, match="cap must be positive, got 0"):
        buckets.capture_order(cap=0)


def test_a_bucket_staged_for_capture_holds_padding_rows_only() -> None:
    """Up-front capture runs each bucket's forward on padding rows: every write and read in
    the scratch page, nothing in a page a sequence could hold."""
    pool = KVPool(
        num_pages=8,
        num_layers=1,
        num_kv_heads=1,
        head_dim=4,
        page_size=16,
        dtype=torch.float32,
        device="cpu",
    )
    spec = GraphSpec(scratch_page=7, max_num_seqs=4, max_context=128, capture=False)
    graphs = DecodeGraphs(torch.nn.Identity(), pool, spec, invariant=True)
    graphs._stage(_EMPTY_STEP, 4, 2)
    ids, positions, slots, tables = graphs._views(4, 2)
    assert ids.tolist() == positions.tolist() == [0, 0, 0, 0]
    assert slots.tolist() == [7 * 16] * 4
    expected = np.zeros((4, 8), dtype=np.int64)
    expected[:, 0] = 7
    assert np.array_equal(tables.numpy(), expected)
