"""CUDA's invariant attention (`invariant_triton`), run on the CPU by Triton's interpreter.

The kernel computes one query token per program, so a token's bits cannot depend on the
other tokens of the call; what can break is the indexing (pages, key counts, group heads,
padding). Checked against a float64 brute force over random pools, page sizes, group sizes
and key counts across the 64-key walk, and a token alone against random crowds, bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from attention_kit import paged_brute_force as brute_force  # noqa: E402
from attention_kit import random_kv_pool as random_pool  # noqa: E402

from astrai_batch.engine.attention.kernels.invariant_triton import (  # noqa: E402
    KEY_BLOCK,
    invariant_attention,
)

CASES = [  # (kv heads, group, head dim, value dim, page size)
    (2, 1, 16, 16, 8),
    (3, 3, 64, 64, 16),
    (1, 4, 32, 24, 4),
    (2, 5, 20, 20, 64),
]


@pytest.mark.parametrize(("kv_heads", "group", "head_dim", "value_dim", "page_size"), CASES)
def test_matches_a_float64_brute_force(kv_heads, group, head_dim, value_dim, page_size):
    g, keys, values = random_pool(1, kv_heads, head_dim, value_dim, page_size)
    pages = keys.shape[0] // page_size
    width = 200 // page_size + 1
    tables = torch.stack([torch.randperm(pages, generator=g)[:width] for _ in range(3)])
    token_keys = torch.tensor([1, 2, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1, 130, 200])
    token_table = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    q = torch.randn(len(token_keys), kv_heads * group, head_dim, generator=g)
    scale = head_dim**-0.5
    args = (tables.int(), token_table.int(), token_keys.int(), page_size, scale)
    got = invariant_attention(q, keys, values, *args)
    assert got.shape == (len(token_keys), kv_heads * group, value_dim)
    assert got.dtype == torch.float32
    expected = brute_force(q, keys, values, *args)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("window", "softcap", "with_sinks"),
    [(40, None, False), (KEY_BLOCK, 1.5, True), (130, None, True), (None, 1.5, False)],
)
def test_windows_sinks_and_softcap_match_a_float64_brute_force(window, softcap, with_sinks):
    kv_heads, group, head_dim, page_size = 2, 3, 16, 8
    g, keys, values = random_pool(2, kv_heads, head_dim, head_dim, page_size)
    pages = keys.shape[0] // page_size
    tables = torch.stack([torch.randperm(pages, generator=g)[:26] for _ in range(3)])
    token_keys = torch.tensor([1, 39, 40, 41, KEY_BLOCK + 1, 130, 131, 200])
    token_table = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    q = torch.randn(len(token_keys), kv_heads * group, head_dim, generator=g)
    sinks = torch.tensor([0.5, -1.0, 2.0, 8.0, -30.0, 1.5]) if with_sinks else None
    args = (tables.int(), token_table.int(), token_keys.int(), page_size, head_dim**-0.5)
    extra = dict(window=window, softcap=softcap, sinks=sinks)
    got = invariant_attention(q, keys, values, *args, **extra)
    expected = brute_force(q, keys, values, *args, **extra)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_a_token_alone_equals_the_token_in_random_crowds(seed):
    kv_heads, group, head_dim, page_size = 2, 3, 32, 8
    g, keys, values = random_pool(seed, kv_heads, head_dim, head_dim, page_size)
    pages = keys.shape[0] // page_size
    tables = torch.stack([torch.randperm(pages, generator=g)[:40] for _ in range(6)]).int()
    q = torch.randn(1, kv_heads * group, head_dim, generator=g)
    table, keys_seen = 2, 150
    alone = invariant_attention(
        q,
        keys,
        values,
        tables,
        torch.tensor([table]).int(),
        torch.tensor([keys_seen]).int(),
        page_size,
        0.2,
    )
    for size in (2, 5, 17):
        crowd_q = torch.randn(size, kv_heads * group, head_dim, generator=g)
        at = int(torch.randint(size, (1,), generator=g))
        crowd_q[at] = q[0]
        token_table = torch.randint(6, (size,), generator=g).int()
        token_keys = torch.randint(1, 300, (size,), generator=g).int()
        token_table[at], token_keys[at] = table, keys_seen
        crowd = invariant_attention(
            crowd_q, keys, values, tables, token_table, token_keys, page_size, 0.2
        )
        assert torch.equal(crowd[at], alone[0]), f"seed {seed}, crowd of {size}"


def test_no_tokens_gives_an_empty_result():
    _, keys, values = random_pool(0, 1, 16, 16, 8)
    empty = torch.zeros(0, dtype=torch.int32)
    out = invariant_attention(
        torch.zeros(0, 2, 16), keys, values, torch.zeros(1, 4).int(), empty, empty, 8, 0.25
    )
    assert out.shape == (0, 2, 16)


# -- compiled for real GPUs, without one ------------------------------------------------------


@pytest.fixture(scope="module")
def builds():
    """Every kernel variant compiled to a cubin for sm_80 and sm_90 by Triton's own compiler
    and bundled ptxas, in a process of its own (this one imported Triton as an interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "astrai_batch.bench.kernel_builds", "--arch", "80", "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_every_kernel_variant_compiles_for_a100_and_h100(builds):
    # two GPUs x (three attention variants, one with a window, sinks and softcapping, and two
    # norm widths)
    assert len(builds) == 2 * 6
    failed = {name: result["error"] for name, result in builds.items() if not result["built"]}
    assert failed == {}
    assert all(result["cubin_bytes"] > 0 for result in builds.values())
    assert {name.split("/")[0] for name in builds} == {"sm_80", "sm_90"}
