"""Which operations invariant numerics run on CUDA, and whether they run at all here.

On CUDA the reduction order of attention and of the norms is fixed by construction in Triton
kernels (`attention.kernels.invariant_triton`, `norm_triton`; docs/gpu.md). They are compiled
on the device the first time they run, so before an engine relies on them they are run once
at the model's shapes: one that does not build on some GPU (or Triton version) must not stop
the engine from loading. Without them the block attention and torch's reductions run, and the
start-up invariance probe judges those.
"""

from __future__ import annotations

import logging

import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.backends import module_importable

_LOG = logging.getLogger(__name__)


def invariant_cuda_ops(device: torch.device):
    """(attention, row mean of squares): the Triton kernels invariant numerics run on CUDA;
    (None, None) elsewhere, or where Triton does not import (then the block attention and row
    tiles, which the start-up probe judges)."""
    if device.type != "cuda" or not module_importable("triton"):
        return None, None
    from astrai_batch.engine.attention.kernels.invariant_triton import invariant_attention
    from astrai_batch.engine.runner.norm_triton import mean_squares

    return invariant_attention, mean_squares


def runnable(ops: tuple, model: torch.nn.Module, pool: KVPool, query_heads: int) -> tuple:
    """`ops` when both kernels compile and run here at the model's shapes, else (None, None):
    then the block attention and torch's reductions run, and the start-up probe judges them.
    A kernel that does not build on some GPU must not stop the engine from loading.
    `query_heads`: this process's (a tensor-parallel rank's share)."""
    attention, mean_squares = ops
    key, value = pool.key_cache[0], pool.value_cache[0]
    device = key.device
    one = torch.ones(1, dtype=torch.int32, device=device)
    try:
        q = torch.zeros(1, query_heads, key.shape[-1], device=device)
        tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
        attention(q, key, value, tables, one - 1, one, pool.page_size, 1.0)
        mean_squares(torch.ones(2, model.config.hidden_size, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a compiler or launch error: any kind
        _LOG.warning(
            "the invariant Triton kernels do not run here (%s); using the block attention", exc
        )
        return None, None
    return ops
