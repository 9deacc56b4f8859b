"""Batch-invariant attention: every query reduces its keys block by block, in block order.

A query's result must not depend on the step it runs in: alone or beside 255 decodes, in a
cascade group or not, as a decode or inside a prefill chunk (a preempted sequence recomputes
its generated tokens as a prefill), wherever its chunk starts. So for every query:

1. scores against each key block (`block_plan`) come from GEMMs whose reduction is over the
   head dimension only; keys after the query are masked to -inf;
2. the row max over all its blocks is exact in any order; the exponentials are elementwise;
3. each block's probability sum (over `block` keys, a fixed length) and its probabilities times
   values (a GEMM over `block` keys) are computed per block;
4. blocks are added in block order 0, 1, 2, ...: a run's blocks by a loop over its block
   axis, then the private units block by block, one addition per block and row, so a
   query's sum is the same sequence of float additions however its blocks were computed.

Softcapping (C * tanh(score / C)) is elementwise on each score before its mask; sinks (one
logit per query head) join the row max and add exp(sink - max) to the row's sum after its
last block, so both keep every step above.

GEMM rows never interact, and the BLAS's result for a row does not depend on the row count
for a fixed reduction length of one head dimension or one block, once the count is one the
BLAS treats like a large one: small GEMMs are padded with zero rows as the step's
`gemm_rows` scheme says (probed at engine start on the CPU, `engine/numerics/blas_rows.py`; MKL on
AMD Zen 4 computes the trailing rows of 1-3, 5-7 and 9-11-row GEMMs with other kernels).
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.block_plan import BlockBatch, BlockRun
from astrai_batch.engine.attention.score_features import apply_softcap
from astrai_batch.engine.numerics.blas_rows import pad_gemm_rows

NEG = float("-inf")


def block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: BlockBatch,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (every query of the step) -> [T, Hq, Dv], float32 accumulation.
    `sinks`: [Hq] a learned logit per query head (`score_features`)."""
    num_tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    qg = q.view(num_tokens, kv_heads, group, head_dim)
    units = batch.units
    # pass 1: every (query, block) score, keys after the query masked; the exact row max
    row_max = q.new_full((num_tokens, kv_heads, group), float("-inf"), dtype=torch.float32)
    run_scores = []
    for run in batch.runs:
        scores = apply_softcap(_run_scores(qg, k_cache, run, batch, scale), softcap)
        if run.key_masked is not None:
            scores.masked_fill_(run.key_masked, NEG)
        row_max.index_copy_(0, run.rows, scores.amax(dim=(1, 4)))
        run_scores.append(scores)
    if units.rows.numel():
        keys = batch.gatherer.gather("key", k_cache, units.page_tables, batch.page_size)
        a = pad_gemm_rows(qg.index_select(0, units.rows), batch.gemm_rows)  # [U, Hkv, G', D]
        unit_scores = torch.matmul(a, keys.permute(0, 2, 3, 1).to(a.dtype))
        unit_scores = apply_softcap(unit_scores.float()[:, :, :group].mul_(scale), softcap)
        unit_scores.masked_fill_(units.masked_keys(batch.block_tokens), NEG)
        unit_max = unit_scores.amax(dim=-1)
        index = units.rows[:, None, None].expand_as(unit_max)
        row_max.scatter_reduce_(0, index, unit_max, "amax")
    if sinks is not None:
        sink = sinks.detach().float().view(1, kv_heads, group)
        row_max = torch.maximum(row_max, sink)
    # pass 2: per block, probability sums and probabilities x values, added in block order
    values = v_cache.shape[-1]
    total = q.new_zeros(num_tokens, kv_heads, group, values, dtype=torch.float32)
    norm = q.new_zeros(num_tokens, kv_heads, group, dtype=torch.float32)
    for run, scores in zip(batch.runs, run_scores, strict=True):
        probs = scores.sub_(row_max.index_select(0, run.rows)[:, None, :, :, None]).exp_()
        sums = probs.sum(dim=-1)  # [n, blocks, Hkv, G]
        out = _run_values(probs, v_cache, run, batch)  # [n, blocks, Hkv, G, Dv]
        run_total, run_norm = out[:, 0].clone(), sums[:, 0].clone()
        for b in range(1, run.num_blocks):
            run_total += out[:, b]
            run_norm += sums[:, b]
        # a row's run blocks are its first blocks: its sum starts here
        total.index_copy_(0, run.rows, run_total)
        norm.index_copy_(0, run.rows, run_norm)
    if units.rows.numel():
        vals = batch.gatherer.gather("value", v_cache, units.page_tables, batch.page_size)
        probs = unit_scores.sub_(row_max.index_select(0, units.rows).unsqueeze(-1)).exp_()
        sums = probs.sum(dim=-1)  # [U, Hkv, G]
        p = pad_gemm_rows(probs, batch.gemm_rows)
        out = torch.matmul(p.to(vals.dtype), vals.permute(0, 2, 1, 3)).float()[:, :, :group]
        starts = units.block_starts
        for b in range(len(starts) - 1):  # block order: one addition per block and row
            lo, hi = starts[b], starts[b + 1]
            if hi > lo:
                total.index_add_(0, units.rows[lo:hi], out[lo:hi])
                norm.index_add_(0, units.rows[lo:hi], sums[lo:hi])
    if sinks is not None:  # the sink's column, after the last block
        norm += (sink - row_max).exp_()
    return total.div_(norm.unsqueeze(-1)).view(num_tokens, q_heads, values)


def _run_scores(
    qg: torch.Tensor, k_cache: torch.Tensor, run: BlockRun, batch: BlockBatch, scale: float
) -> torch.Tensor:
    """[n, run blocks, Hkv, G, block] scores of the run's rows against its blocks."""
    n = run.rows.shape[0]
    _, kv_heads, group, dim = qg.shape
    keys = batch.gatherer.gather("run_key", k_cache, run.page_table, batch.page_size)[0]
    a = pad_gemm_rows(
        qg.index_select(0, run.rows).permute(1, 0, 2, 3).reshape(kv_heads, 1, n * group, dim),
        batch.gemm_rows,
    )
    b = keys.view(run.num_blocks, batch.block_tokens, kv_heads, dim).permute(2, 0, 3, 1)
    s = torch.matmul(a, b.to(a.dtype)).float()[:, :, : n * group].mul_(scale)
    # [Hkv, blocks, n * G, block] -> [n, blocks, Hkv, G, block]
    s = s.view(kv_heads, run.num_blocks, n, group, batch.block_tokens)
    return s.permute(2, 1, 0, 3, 4)


def _run_values(probs: torch.Tensor, v_cache: torch.Tensor, run: BlockRun, batch: BlockBatch):
    """probs [n, run blocks, Hkv, G, block] -> [n, run blocks, Hkv, G, Dv], per block."""
    n = run.rows.shape[0]
    _, _, kv_heads, group, block = probs.shape
    vals = batch.gatherer.gather("run_value", v_cache, run.page_table, batch.page_size)[0]
    width = vals.shape[-1]
    p = pad_gemm_rows(
        probs.permute(1, 2, 0, 3, 4).reshape(run.num_blocks, kv_heads, n * group, block),
        batch.gemm_rows,
    )
    v = vals.view(run.num_blocks, block, kv_heads, width).permute(0, 2, 1, 3)
    o = torch.matmul(p.to(v.dtype), v).float()[:, :, : n * group]  # [blocks, Hkv, n * G, Dv]
    return o.view(run.num_blocks, kv_heads, n, group, width).permute(2, 0, 1, 3, 4)
