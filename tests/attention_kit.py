"""Shared pieces of the paged attention tests: a pool of sequences over shuffled (some
shared) pages with a fixed query per position, random step mixes of their chunks and
decodes as a step's arrays, and a float64 brute force with windows, sinks and softcapping."""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

from astrai_batch.engine.attention.block_plan import block_tokens_for
from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.numerics.blas_rows import RowScheme, attention_row_scheme

PAGE = 16
KV_HEADS, GROUP, DIM = 2, 3, 16
SCALE = DIM**-0.5
LENGTHS = (5, 40, 300, 511, 512, 513, 700, 1100, 1500)  # the pool's sequences
# (sequence, shares the first pages of) : a prefix cache's shared pages, so decodes share
# whole 512-key blocks (the cascade): 513 and 700 share 512 tokens with 512, 1500 shares
# 1,024 with 1100
SHARED = {5: (4, 32), 6: (4, 32), 8: (7, 64)}


@functools.cache
def probed_gemm_rows() -> RowScheme:
    """The block attention's GEMM row scheme on this CPU, as the engine probes it: a fixed
    scheme holds only on the BLAS it was read from (CI's CPU differs from ours)."""
    return attention_row_scheme(
        DIM, DIM, block_tokens_for(PAGE), 3 * 1024, torch.device("cpu"), torch.float32
    )


class Pool:
    """KV for every sequence in LENGTHS, in shuffled pages (some shared, `SHARED`); a fixed
    query per position."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        pages = [-(-n // PAGE) for n in LENGTHS]
        order = list(range(1, sum(pages) + 1))  # page 0: the padding page
        rng.shuffle(order)
        self.tables, used = [], 0
        for seq, count in enumerate(pages):
            table = np.array(order[used : used + count], dtype=np.int64)
            used += count
            if seq in SHARED:
                owner, shared = SHARED[seq]
                table[:shared] = self.tables[owner][:shared]
            self.tables.append(table)
        slots = (sum(pages) + 1) * PAGE
        self.keys = torch.randn(slots, KV_HEADS, DIM, generator=generator)
        self.values = torch.randn(slots, KV_HEADS, DIM, generator=generator)
        self.queries = [torch.randn(n, KV_HEADS * GROUP, DIM, generator=generator) for n in LENGTHS]

    def slots(self, seq: int, positions: range) -> np.ndarray:
        at = np.arange(positions.start, positions.stop, dtype=np.int64)
        return self.tables[seq][at // PAGE] * PAGE + at % PAGE


def random_steps(rng: random.Random) -> list[list[tuple[int, int, int]]]:
    """Every position of every sequence, cut into chunks and decodes, mixed into steps."""
    pieces = []
    for seq, n in enumerate(LENGTHS):
        start = 0
        while start < n:
            length = 1 if rng.random() < 0.3 else rng.randint(1, n - start)
            length = min(length, n - start)
            pieces.append((seq, start, length))
            start += length
    rng.shuffle(pieces)
    # a step holds at most one chunk per sequence, as the scheduler makes them
    steps: list[list[tuple[int, int, int]]] = []
    for piece in pieces:
        home = [s for s in steps if all(c[0] != piece[0] for c in s) and rng.random() < 0.7]
        if not home:
            steps.append([])
            home = [steps[-1]]
        home[0].append(piece)
    return steps


def brute_force(pool: Pool, seq: int, p: int, window=None, sinks=None, softcap=None):
    """Position p's attention in float64: softmax over its visible keys (and the sinks'
    column, dropped), as transformers' eager attention forms it."""
    q = pool.queries[seq][p].double().view(KV_HEADS, GROUP, DIM)
    first = 0 if window is None else max(p - window + 1, 0)
    slots = pool.slots(seq, range(first, p + 1))
    k = pool.keys[slots].double().transpose(0, 1)  # [Hkv, keys, D]
    v = pool.values[slots].double().transpose(0, 1)
    scores = q @ k.transpose(1, 2) * SCALE  # [Hkv, G, keys]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if sinks is not None:
        column = sinks.double().view(KV_HEADS, GROUP, 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return (weights @ v).reshape(KV_HEADS * GROUP, DIM)


SINKS = torch.tensor([0.5, -1.0, 2.0, 8.0, -30.0, 1.5])  # one above every score, one far below


def step_for(
    pool: Pool, chunks: list[tuple[int, int, int]], key_limits=None, with_slots: bool = False
) -> tuple[StepArrays, torch.Tensor]:
    """The step holding `chunks` (sequence, start, length) and its queries, packed; its
    write slots the tokens' pool slots when `with_slots`, `key_limits(positions)` each
    query's last key where given (image spans)."""
    width = max(len(pool.tables[s]) for s, _, _ in chunks)
    tables = np.zeros((len(chunks), width), dtype=np.int64)
    starts, queries = [], []
    row = 0
    for i, (seq, start, n) in enumerate(chunks):
        tables[i, : len(pool.tables[seq])] = pool.tables[seq]
        starts.append(row)
        queries.append(pool.queries[seq][start : start + n])
        row += n
    num_tokens = np.array([n for _, _, n in chunks], dtype=np.int64)
    positions = np.concatenate([s + np.arange(n) for _, s, n in chunks])
    slots = np.zeros(row, dtype=np.int64)
    if with_slots:
        slots = np.concatenate([pool.slots(seq, range(s, s + n)) for seq, s, n in chunks])
    step = StepArrays(
        token_ids=np.zeros(row, dtype=np.int64),
        positions=positions,
        write_slots=slots,
        logit_rows=np.zeros(0, dtype=np.int64),
        token_start=np.array(starts, dtype=np.int64),
        num_tokens=num_tokens,
        context_start=np.array([s for _, s, _ in chunks], dtype=np.int64),
        page_tables=tables,
        decodes=np.flatnonzero(num_tokens == 1),
        longest_context=max(s + n for _, s, n in chunks),
        key_limits=None if key_limits is None else key_limits(positions),
    )
    return step, torch.cat(queries)


def random_kv_pool(seed, kv_heads, head_dim, value_dim, page_size, pages=80):
    """A generator and random keys and values of `pages` pages: a paged pool."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(pages * page_size, kv_heads, head_dim, generator=g)
    values = torch.randn(pages * page_size, kv_heads, value_dim, generator=g)
    return g, keys, values


def paged_brute_force(
    q,
    keys,
    values,
    tables,
    token_table,
    token_keys,
    page_size,
    scale,
    window=None,
    softcap=None,
    sinks=None,
    key_ends=None,
):
    """The attention kernels' interface in float64: token t sees the first token_keys[t]
    keys of its table's pages (key_ends[t] where given, an image's end), the last `window`
    of its own position's."""
    kv_heads = keys.shape[1]
    out = []
    for t in range(q.shape[0]):
        n = int(token_keys[t])
        end = n if key_ends is None else int(key_ends[t])
        row = tables[int(token_table[t])].long()
        slots = (row[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:end]
        if window is not None:
            slots = slots[max(n - window, 0) :]
        k, v = keys[slots].double(), values[slots].double()
        qq = q[t].double().view(kv_heads, -1, q.shape[-1])
        scores = torch.einsum("hgd,khd->hgk", qq, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if sinks is not None:
            column = sinks.double().view(kv_heads, -1, 1)
            weights = torch.cat([scores, column], dim=-1).softmax(-1)[..., :-1]
        else:
            weights = scores.softmax(-1)
        out.append(torch.einsum("hgk,khd->hgd", weights, v).reshape(q.shape[1], -1))
    return torch.stack(out)
