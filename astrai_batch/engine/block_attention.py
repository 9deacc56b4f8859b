"""Batch-invariant attention: every query reduces its keys block by block, in block order.

A query's result must not depend on the step it runs in: alone or beside 255 decodes, in a
cascade group or not, as a decode or inside a prefill chunk (a preempted sequence recomputes
its generated tokens as a prefill), wherever its chunk starts. So for every query:

1. scores against each key block (`block_plan`) come from GEMMs whose reduction is over the
   head dimension only, written to the query's own slot of a [T, blocks, Hkv, G, block]
   buffer; keys after the query are masked to -inf;
2. the row max over all its blocks is exact in any order; the exponentials are elementwise;
3. each block's probability sum (over `block` keys, a fixed length) and its probabilities times
   values (a GEMM over `block` keys) land in the query's block slot;
4. blocks are added in block order 0, 1, 2, ... by a loop over the block axis, so a query's
   sum is the same sequence of float additions whatever the number of blocks of the others
   (absent blocks add exact zeros).

GEMM rows never interact, and the BLAS's result for a row does not depend on the row count
for a fixed reduction length of one head dimension or one block (`tests/engine/
test_block_attention.py` checks this on the machine it runs on); one-row GEMMs are avoided
because they take the BLAS's matrix-vector path, which sums in another order.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.block_plan import BlockBatch


def block_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: BlockBatch, scale: float
) -> torch.Tensor:
    """q [T, Hq, D] (every query of the step) -> [T, Hq, Dv], float32 accumulation."""
    num_tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    block = batch.block_tokens
    blocks = batch.num_blocks
    qg = q.view(num_tokens, kv_heads, group, head_dim)
    # fill the scores of each (query, block) slot; slots a query does not reach are masked
    scores = q.new_empty(num_tokens, blocks, kv_heads, group, block, dtype=torch.float32)
    values = v_cache.shape[-1]
    for run in batch.runs:
        scores[:, : run.num_blocks].index_copy_(
            0, run.rows, _run_scores(qg, k_cache, run, batch, scale)
        )
    units = batch.unit_rows.shape[0]
    if units:
        keys = batch.gatherer.gather("key", k_cache, batch.unit_tables, batch.page_size)
        a = _rows_at_least_two(qg.index_select(0, batch.unit_rows))  # [U, Hkv, G', D]
        b = keys.permute(0, 2, 3, 1)  # [U, Hkv, D, block]
        s = torch.matmul(a, b.to(a.dtype)).float()[:, :, :group].mul_(scale)
        scores[batch.unit_rows, batch.unit_blocks] = s
    scores.masked_fill_(~batch.key_valid, float("-inf"))
    row_max = scores.amax(dim=(1, 4), keepdim=True)
    probs = scores.sub_(row_max).exp_()
    block_sums = probs.sum(dim=-1)  # [T, blocks, Hkv, G]
    partial = q.new_zeros(num_tokens, blocks, kv_heads, group, values, dtype=torch.float32)
    for run in batch.runs:
        partial[:, : run.num_blocks].index_copy_(
            0, run.rows, _run_values(probs, v_cache, run, batch)
        )
    if units:
        vals = batch.gatherer.gather("value", v_cache, batch.unit_tables, batch.page_size)
        p = _rows_at_least_two(probs[batch.unit_rows, batch.unit_blocks])  # [U, Hkv, G', B]
        o = torch.matmul(p.to(vals.dtype), vals.permute(0, 2, 1, 3)).float()[:, :, :group]
        partial[batch.unit_rows, batch.unit_blocks] = o
    # block order, one addition per block: the same float sequence for every query
    total = partial[:, 0].clone()
    norm = block_sums[:, 0].clone()
    for b in range(1, blocks):
        total += partial[:, b]
        norm += block_sums[:, b]
    out = total.div_(norm.unsqueeze(-1))
    return out.view(num_tokens, q_heads, values)


def _run_scores(
    qg: torch.Tensor, k_cache: torch.Tensor, run, batch: BlockBatch, scale: float
) -> torch.Tensor:
    """[n, run blocks, Hkv, G, block] scores of the run's rows against its blocks."""
    n = run.rows.shape[0]
    _, kv_heads, group, dim = qg.shape
    keys = batch.gatherer.gather("run_key", k_cache, run.page_table, batch.page_size)[0]
    a = _rows_at_least_two(
        qg.index_select(0, run.rows).permute(1, 0, 2, 3).reshape(kv_heads, 1, n * group, dim)
    )
    b = keys.view(run.num_blocks, batch.block_tokens, kv_heads, dim).permute(2, 0, 3, 1)
    s = torch.matmul(a, b.to(a.dtype)).float()[:, :, : n * group].mul_(scale)
    # [Hkv, blocks, n * G, block] -> [n, blocks, Hkv, G, block]
    s = s.view(kv_heads, run.num_blocks, n, group, batch.block_tokens)
    return s.permute(2, 1, 0, 3, 4)


def _run_values(probs: torch.Tensor, v_cache: torch.Tensor, run, batch: BlockBatch):
    """[n, run blocks, Hkv, G, Dv] probabilities times values of the run's rows, per block."""
    n = run.rows.shape[0]
    _, _, kv_heads, group, block = probs.shape
    vals = batch.gatherer.gather("run_value", v_cache, run.page_table, batch.page_size)[0]
    width = vals.shape[-1]
    p = probs[:, : run.num_blocks].index_select(0, run.rows)  # [n, blocks, Hkv, G, B]
    p = _rows_at_least_two(p.permute(1, 2, 0, 3, 4).reshape(run.num_blocks, kv_heads, n * group, block))
    v = vals.view(run.num_blocks, block, kv_heads, width).permute(0, 2, 1, 3)
    o = torch.matmul(p.to(v.dtype), v).float()[:, :, : n * group]  # [blocks, Hkv, n * G, Dv]
    return o.view(run.num_blocks, kv_heads, n, group, width).permute(2, 0, 1, 3, 4)


def _rows_at_least_two(x: torch.Tensor) -> torch.Tensor:
    """Pads the GEMM row axis (-2) to two rows with zeros when it has one."""
    if x.shape[-2] >= 2:
        return x
    return torch.cat([x, torch.zeros_like(x)], dim=-2)
