"""The block attention with sliding windows, sinks and softcapping (`block_attention`,
`block_plan`): against a float64 brute force, and a query's bits alone against the same
query in random crowds (chunks cut at random points, decodes, block-crossing windows).

The pool, its random step mixes and the brute force: `attention_kit`, shared with the
flash-kernel tests.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from attention_kit import (
    LENGTHS,
    PAGE,
    SCALE,
    SINKS,
    Pool,
    brute_force,
    probed_gemm_rows,
    random_steps,
    step_for,
)

from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.paged_attention import paged_attention
from astrai_batch.engine.attention.score_features import WindowPlans
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO
from astrai_batch.engine.runner.attention_batches import block_batch


@pytest.fixture(scope="module")
def gemm_rows():
    return probed_gemm_rows()


def run_step(pool: Pool, chunks, window=None, sinks=None, softcap=None, gemm_rows=None) -> dict:
    """The step through `paged_attention` as a layer calls it: its plans by window, the
    layer's window, sinks and softcap as transformers passes them."""
    step, q = step_for(pool, chunks)
    view = SimpleNamespace(key_cache=[pool.keys], value_cache=[pool.values], page_size=PAGE)
    staging, gatherer = HostStaging("cpu"), PageGatherer()

    def plan(w):
        return block_batch(
            step,
            view,
            staging,
            gatherer,
            use_cascade=True,
            gemm_rows=gemm_rows or ROWS_AT_LEAST_TWO,
            window=w,
        )

    plans = WindowPlans(plan(None), plan)
    # keys already sit in the pool: the layer writes its new rows back over themselves
    rows = torch.from_numpy(np.concatenate([pool.slots(s, range(a, a + n)) for s, a, n in chunks]))
    plans.full = plans.full._replace(write_slots=rows)
    plans._build = lambda w: plan(w)._replace(write_slots=rows)
    key, value = pool.keys[rows], pool.values[rows]
    out, _ = paged_attention(
        SimpleNamespace(layer_idx=0),
        q.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        None,
        scaling=SCALE,
        astrai_attention_batch=plans,
        sliding_window=window,
        softcap=softcap,
        s_aux=sinks,
    )
    got, row = {}, 0
    for seq, start, n in chunks:
        for p in range(start, start + n):
            got[(seq, p)] = out[0, row]
            row += 1
    return got


CHUNKS = [(0, 0, 5), (2, 100, 200), (4, 511, 1), (5, 0, 513), (6, 699, 1), (7, 1000, 100)]
CASES = {
    "full": (None, None, None),
    "window-40": (40, None, None),
    "window-130-sinks": (130, SINKS, None),
    "softcap": (None, None, 1.5),
    "window-300-sinks-softcap": (300, SINKS, 1.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_a_float64_brute_force(name) -> None:
    window, sinks, softcap = CASES[name]
    pool = Pool(seed=1)
    got = run_step(pool, CHUNKS, window, sinks, softcap)
    for (seq, p), row in got.items():
        want = brute_force(pool, seq, p, window, sinks, softcap)
        torch.testing.assert_close(row.double(), want, atol=2e-6, rtol=1e-5)


def test_a_window_that_binds_nothing_keeps_the_full_plan() -> None:
    plans = WindowPlans(SimpleNamespace(longest_context=40), lambda w: ("windowed", w))
    assert plans.plan(40) is plans.full and plans.plan(None) is plans.full
    assert plans.plan(39) == ("windowed", 39) and plans.plan(39) is plans.plan(39)


@pytest.mark.parametrize("seed", range(2))
def test_windowed_softcapped_queries_have_the_same_bits_alone_and_in_crowds(gemm_rows, seed):
    window = (64, 200)[seed]  # inside one 64-key block, and across several
    pool = Pool(seed=seed)
    alone = {}
    for seq, n in enumerate(LENGTHS):
        alone.update(run_step(pool, [(seq, 0, n)], window, SINKS, 1.5, gemm_rows))
    for step in random_steps(random.Random(seed)):
        for key, row in run_step(pool, step, window, SINKS, 1.5, gemm_rows).items():
            assert torch.equal(row, alone[key]), f"seed {seed}: {key} differs in step {step}"
