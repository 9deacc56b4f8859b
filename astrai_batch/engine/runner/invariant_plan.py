"""The invariant numerics' plan for one runner: which row scheme its GEMMs use, and where its
attention runs (CUDA's Triton kernel, the CPU's C kernel in bfloat16, torch's CPU flash kernel
in probed blocks, or the block attention at probed row counts). Every probe runs once per
loaded model (`probe_results`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.block_plan import RUN_SEGMENT_BLOCKS, block_tokens_for
from astrai_batch.engine.attention.flash_block_types import FlashRules
from astrai_batch.engine.attention.flash_probe import probe_flash_block
from astrai_batch.engine.numerics.blas_rows import ROWS_AT_LEAST_TWO, attention_row_scheme
from astrai_batch.engine.runner.fused_layers import fusion_supported, set_fused_layers
from astrai_batch.engine.runner.invariant_cpu import cpu_attention
from astrai_batch.engine.runner.invariant_cuda import invariant_cuda_ops, runnable
from astrai_batch.engine.runner.invariant_experts import set_expert_tiling
from astrai_batch.engine.runner.invariant_linear import (
    gemm_shapes,
    pack_plain_linears,
    pack_weights,
    row_schemes_for,
    set_row_tiling,
)
from astrai_batch.engine.runner.invariant_norms import set_norm_tiling
from astrai_batch.engine.runner.linear_check import refuse_variant_linears
from astrai_batch.engine.runner.transposed_linears import (
    transpose_plain_linears,
    transpose_weights,
)


class NumericsPlan(NamedTuple):
    # the BLAS's invariant GEMM row counts for the block attention (raises where none exist)
    gemm_rows: object
    # the flash kernel's invariant shapes when invariant attention runs in it (the CPU)
    flash: FlashRules | None
    # the invariant attention kernel: CUDA's (`invariant_triton`), the CPU's in bfloat16
    # (`invariant_cpu`), or None
    invariant_kernel: object


def plan_numerics(
    model: torch.nn.Module,
    attention_pool: KVPool,
    numerics: str,
    query_heads: int,
    features,
    graphs,
    probe_results: dict | None,
) -> NumericsPlan:
    """Sets the model's linear, expert and norm tiling for `numerics` and plans its attention."""
    memo = {} if probe_results is None else probe_results
    if numerics != "invariant":
        set_row_tiling(model, False)
        set_expert_tiling(model, False)
        set_norm_tiling(model, False)
        pack_plain_linears(model, memo)  # bfloat16 on the CPU: one GEMM a step, packed
        transpose_plain_linears(model, memo)  # float32 on the CPU: W xᵀ where faster
        _fuse_layers(model, memo)
        # the C kernel is the CPU's fastest bfloat16 attention under fast numerics too
        kernel = None
        if graphs is None and features.softcap is None:
            kernel = _cpu_kernel(memo, query_heads, attention_pool)
        return NumericsPlan(ROWS_AT_LEAST_TWO, None, kernel)
    set_row_tiling(model, False)  # a fast engine's layers (one GEMM, packed) give way
    refuse_variant_linears(model)  # quantized layers: invariant, or refused
    param = next(model.parameters())
    where = (torch.get_num_threads(), param.device.type, param.dtype)
    shapes = tuple(gemm_shapes(model))
    # raises where no scheme exists
    scheme = _probed(memo, ("linear rows", shapes, where), lambda: row_schemes_for(model))
    set_row_tiling(model, True, scheme)
    pack_weights(model, memo)  # the same bits, without repacking per call (bfloat16, CPU)
    transpose_weights(model, memo)  # the same bits, faster (float32, CPU, where verified)
    _fuse_layers(model, memo)
    set_expert_tiling(model, True, scheme)  # MoE: each expert's GEMM, the router's
    heads = (*_heads_key(query_heads, attention_pool), where)
    # CUDA: attention and norm reductions in a construction-fixed order (Triton)
    ops = invariant_cuda_ops(param.device)
    if ops[0] is not None:
        ops = _probed(
            memo, ("triton", heads), lambda: runnable(ops, model, attention_pool, query_heads)
        )
    invariant_kernel, mean_squares = ops
    if mean_squares is not None or param.device.type != "cpu":
        set_norm_tiling(model, True, mean_squares)
    flash = None
    flash_fits = features.softcap is None  # neither the flash kernel nor the C one softcaps
    if graphs is None and invariant_kernel is None and flash_fits:
        invariant_kernel = _cpu_kernel(memo, query_heads, attention_pool)
    if graphs is None and invariant_kernel is None and flash_fits:
        flash = _probed(memo, ("flash", heads), lambda: _flash_rules(query_heads, attention_pool))
    gemm_rows = ROWS_AT_LEAST_TWO
    if flash is None and invariant_kernel is None:
        key = ("block attention rows", heads)
        gemm_rows = _probed(memo, key, lambda: _attention_rows(query_heads, attention_pool))
    return NumericsPlan(gemm_rows, flash, invariant_kernel)


def _fuse_layers(model: torch.nn.Module, memo: dict) -> None:
    """Either numerics, once the linears are set up: norms, rotary, activation and pool writes
    in C, q/k/v and gate/up merged, where that changes no bit (`fused_layers`, CPU bfloat16)."""
    set_fused_layers(model, fusion_supported(model), memo)


def _cpu_kernel(memo: dict, query_heads: int, pool: KVPool):
    """The CPU's C attention kernel for this pool (bfloat16), or None; tried once per model."""
    key = ("cpu kernel", *_heads_key(query_heads, pool), pool.key_cache[0].dtype)
    return _probed(memo, key, lambda: cpu_attention(query_heads, pool))


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
    CPU, equal key and value sizes, and the probe passing for a key block of whole pages (the
    shortest that does: fixed for the model, its pages and the machine); else None. (Not with
    decode graphs either: their fixed-shape attention gives the block attention's bits.)"""
    key, value = pool.key_cache[0], pool.value_cache[0]
    kv_heads, head_dim = key.shape[1:]
    if key.device.type != "cpu" or value.shape[-1] != head_dim:
        return None
    try:
        found = probe_flash_block(head_dim, kv_heads, key.dtype, pool.page_size)
    except RuntimeError:  # the kernel does not take this dtype or head size here
        return None
    if found is None:
        return None
    block, tails = found
    return FlashRules(group=query_heads // kv_heads, tails=tails, block=block)


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
