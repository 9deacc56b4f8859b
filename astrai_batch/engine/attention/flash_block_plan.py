"""The step's calls of torch's CPU flash kernel under invariant numerics (`flash_blocks`).

torch's CPU flash kernel splits a call's keys into blocks of `min(512, keys)` from position 0
and folds them in order with an online softmax; it splits queries into blocks of 32, 64 or
256 rows, each block's scores and probabilities x values one MKL GEMM. A query's result is
therefore the same in every call when:

1. the key length is whole blocks of `KEY_BLOCK` (512) and a *tail* from the probed set: the
   split is by position, never by the call; blocks past a query's own keys are fully
   masked, and a fully masked block changes nothing (its probabilities are exact zeros, its
   rescale factor exp(0) = 1, and the P x V GEMM adds exact zeros, the masked keys and
   values being finite). Within a block, masked keys add exact zeros to the sums too, but
   the BLAS sums a P x V GEMM's keys in chunks set by its length (MKL here: a last block of
   256 or 320 keys sums otherwise than one of 512), so only tail lengths whose rows equal
   the 512-key ones are used (`flash_probe`: 64, 128, 192, 384, 448 and 512 here);
2. every query block has a row count the BLAS treats like a large one: the call's query rows
   are padded with zero rows to a multiple of `ROW_MULTIPLE` (the last block's remainder is
   then 0 or at least 4; MKL computes the trailing rows of 1-3-row remainders with other
   micro-kernels);
3. masked keys get -inf from an additive mask, in every call the same code path.

`flash_probe` checks these on the engine's CPU at start. A call is one prefill chunk (its
rows are the chunk's tokens) or the step's decodes with the same number of key blocks (a
batch of one-token elements, each with its own pages), query heads sharing a KV head folded
into the query rows: (group member, token) order, as the fast path folds them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.step_arrays import StepArrays

KEY_BLOCK = 512  # torch's CPU flash kernel's key split (`kv_split_size`)
TAIL_STEP = 64  # candidate last-block lengths: multiples of this up to KEY_BLOCK
ROW_MULTIPLE = 4  # query rows per call padded to a multiple of this


class FlashRules(NamedTuple):
    """What the probe found: the kernel's invariant shapes for this model, here."""

    group: int  # query heads per KV head
    tails: tuple[int, ...]  # last-block key lengths with the full block's bits, ascending


class FlashCall(NamedTuple):
    """`elements` sequences of `tokens` query tokens each, attending `keys` keys each."""

    rows: torch.Tensor  # [elements * tokens] packed-batch rows, element-major
    first_row: int | None  # rows are first_row, first_row + 1, ... (a prefill chunk)
    elements: int
    tokens: int
    query_rows: int  # group * tokens, padded up to a multiple of ROW_MULTIPLE
    keys: int  # whole KEY_BLOCKs and a probed tail
    page_tables: torch.Tensor  # [elements, pages covering `keys`], padded with page 0
    mask: torch.Tensor  # [elements, 1, query_rows or 1, keys]: 0, or -inf past the query


class FlashBlockBatch(NamedTuple):
    """What every layer needs; built once per step."""

    key_cache: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    value_cache: list[torch.Tensor]
    page_size: int
    write_slots: torch.Tensor  # [T]
    longest_context: int
    calls: list[FlashCall]
    gatherer: PageGatherer


def padded_rows(rows: int) -> int:
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def key_lengths(contexts: np.ndarray, tails: tuple[int, ...]) -> np.ndarray:
    """Keys a call reads for sequences of `contexts` tokens: whole blocks, then the shortest
    probed tail that holds the rest."""
    full = (contexts - 1) // KEY_BLOCK
    rest = contexts - full * KEY_BLOCK
    table = np.array(tails)
    return full * KEY_BLOCK + table[np.searchsorted(table, rest)]


def plan_flash_calls(
    step: StepArrays, page_size: int, rules: FlashRules, dtype: torch.dtype, staging: HostStaging
) -> list[FlashCall]:
    """One call per prefill chunk, one per decode class (decodes with as many keys)."""
    group = rules.group
    calls = []
    for i in np.flatnonzero(step.num_tokens > 1).tolist():
        context = step.context_start[i] + step.num_tokens[i]
        calls.append(
            _chunk_call(
                int(key_lengths(np.array([context]), rules.tails)[0]),
                int(step.token_start[i]),
                int(step.context_start[i]),
                int(step.num_tokens[i]),
                step.page_tables[i],
                page_size,
                group,
                dtype,
                staging,
            )
        )
    d = step.decodes
    if len(d):
        keys = key_lengths(step.context_start[d] + 1, rules.tails)
        for count in np.unique(keys).tolist():
            members = d[keys == count]
            calls.append(
                _decode_call(
                    step.token_start[members],
                    step.context_start[members],
                    step.page_tables[members],
                    count,
                    page_size,
                    group,
                    dtype,
                    staging,
                )
            )
    return calls


def _chunk_call(keys, row, start, n, table, page_size, group, dtype, staging) -> FlashCall:
    positions = torch.arange(start, start + n)
    masked = torch.arange(keys)[None, :] > positions[:, None]  # [n, keys]
    rows = padded_rows(group * n)
    mask = torch.zeros(rows, keys, dtype=dtype)
    mask[: group * n].view(group, n, keys).masked_fill_(masked, float("-inf"))
    return FlashCall(
        rows=staging.array(np.arange(row, row + n, dtype=np.int64)),
        first_row=row,
        elements=1,
        tokens=n,
        query_rows=rows,
        keys=keys,
        page_tables=staging.array(_tables(table[None, :], keys, page_size)),
        mask=staging.tensor(mask.view(1, 1, rows, keys)),
    )


def _decode_call(rows, positions, tables, keys, page_size, group, dtype, staging) -> FlashCall:
    masked = np.arange(keys)[None, :] > positions[:, None]  # [B, keys]
    mask = torch.zeros(len(rows), keys, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(masked), float("-inf"))
    return FlashCall(
        rows=staging.array(rows),
        first_row=None,
        elements=len(rows),
        tokens=1,
        query_rows=padded_rows(group),
        keys=keys,
        page_tables=staging.array(_tables(tables, keys, page_size)),
        mask=staging.tensor(mask.view(len(rows), 1, 1, keys)),
    )


def _tables(tables: np.ndarray, keys: int, page_size: int) -> np.ndarray:
    """[N, pages covering `keys`]: cut, or padded with page 0 (its keys are masked)."""
    pages = -(-keys // page_size)
    if tables.shape[1] >= pages:
        return tables[:, :pages]
    out = np.zeros((len(tables), pages), dtype=np.int64)
    out[:, : tables.shape[1]] = tables
    return out
