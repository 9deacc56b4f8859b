"""A step's paged-KV metadata in the form the CUDA kernels take, built from its `StepArrays`.

Both kernels see the step as a ragged batch: chunk i owns query rows
`[qo_indptr[i], qo_indptr[i + 1])` (a decode is a chunk of one row) and attends causally to
the first `kv_lengths[i]` keys of its sequence, the bottom-right-aligned causal mask of a
chunk appended to its context. Its keys are found through pages:

- FlashInfer (CSR): pages `kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`, the last holding
  `last_page_len[i]` (1..page_size) keys;
- flash-attn: row i of `block_table` (zero-padded past the pages it needs), `cu_seqlens_k`
  the running sum of the key lengths.

Everything is one vectorized numpy pass over the step's page-table matrix: no per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from astrai_batch.engine.attention.step_arrays import StepArrays


@dataclass(frozen=True)
class PagedKVMetadata:
    """int32 arrays on the host; `page_size` is the pool's."""

    page_size: int
    qo_indptr: np.ndarray  # [C + 1]
    kv_indptr: np.ndarray  # [C + 1] in pages
    kv_indices: np.ndarray  # [kv_indptr[-1]]
    last_page_len: np.ndarray  # [C]
    kv_lengths: np.ndarray  # [C] keys each chunk attends to (context + its new tokens)
    cu_seqlens_k: np.ndarray  # [C + 1]
    block_table: np.ndarray  # [C, P] each chunk's pages, zero-padded
    max_q_len: int
    max_kv_len: int

    @property
    def num_chunks(self) -> int:
        return len(self.last_page_len)


def paged_kv_metadata(step: StepArrays, page_size: int) -> PagedKVMetadata:
    lengths = step.lengths
    pages = step.pages_needed(page_size)
    table = step.page_tables  # already zero past each row's needed pages
    width = table.shape[1]
    used = np.arange(width) < pages[:, None]
    return PagedKVMetadata(
        page_size=page_size,
        qo_indptr=_indptr(step.num_tokens),
        kv_indptr=_indptr(pages),
        kv_indices=table[used].astype(np.int32),  # row-major: chunk by chunk, pages in order
        last_page_len=(lengths - (pages - 1) * page_size).astype(np.int32),
        kv_lengths=lengths.astype(np.int32),
        cu_seqlens_k=_indptr(lengths),
        block_table=np.ascontiguousarray(table, dtype=np.int32),
        max_q_len=int(step.num_tokens.max()),
        max_kv_len=int(lengths.max()),
    )


def _indptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int32)
    out[1:] = np.cumsum(counts)
    return out
