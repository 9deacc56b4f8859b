"""The kernels' paged-KV metadata equals a per-row construction from the chunks themselves.

Random steps over kept step buffers (so rows persist, grow and are released between steps):
prefills from position 0, chunked prefills continuing a context, and decodes, over page
tables that hold more pages than a chunk needs. The reference walks each chunk in Python.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from astrai_batch.engine.attention.kernels.paged_kv_metadata import paged_kv_metadata
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.runner.step_buffers import StepBuffers


def per_row(chunks: list[ScheduledChunk], page: int) -> dict:
    qo, kv, indices, last, lengths, cu_k, tables = [0], [0], [], [], [], [0], []
    for chunk in chunks:
        length = chunk.start + len(chunk.token_ids)
        needed = (length + page - 1) // page
        pages = [int(p) for p in chunk.pages[:needed]]
        qo.append(qo[-1] + len(chunk.token_ids))
        kv.append(kv[-1] + needed)
        indices.extend(pages)
        last.append(length - (needed - 1) * page)
        lengths.append(length)
        cu_k.append(cu_k[-1] + length)
        tables.append(pages)
    width = max(len(t) for t in tables)
    return {
        "qo_indptr": qo,
        "kv_indptr": kv,
        "kv_indices": indices,
        "last_page_len": last,
        "kv_lengths": lengths,
        "cu_seqlens_k": cu_k,
        "block_table": [t + [0] * (width - len(t)) for t in tables],
        "max_q_len": max(len(c.token_ids) for c in chunks),
        "max_kv_len": max(lengths),
    }


def random_steps(seed: int, page: int, steps: int):
    """Steps of chunks for sequences that live across steps (seq_key, pages_version)."""
    rng = random.Random(seed)
    free_pages = list(range(1, 20_000))
    rng.shuffle(free_pages)
    live: dict[int, dict] = {}
    next_key = 0
    for _ in range(steps):
        for _ in range(rng.randint(0, 3)):  # arrivals
            prompt = rng.randint(1, 40)
            live[next_key] = {"done": 0, "prompt": prompt, "pages": [], "version": 0}
            next_key += 1
        for key in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 2))):
            free_pages.extend(live.pop(key)["pages"])  # finished or preempted
        chunks = []
        for key, seq in sorted(live.items()):
            if rng.random() < 0.2:
                continue  # not scheduled this step
            if seq["done"] < seq["prompt"]:
                n = min(seq["prompt"] - seq["done"], rng.randint(1, 12))  # a prefill chunk
            else:
                n = 1  # a decode
            end = seq["done"] + n
            extra = rng.randint(0, 2)  # tables may hold pages past what the chunk needs
            while len(seq["pages"]) * page < end + extra * page:
                seq["pages"].append(free_pages.pop())
                seq["version"] += 1
            chunks.append(
                ScheduledChunk(
                    [rng.randrange(3, 100) for _ in range(n)],
                    seq["done"],
                    list(seq["pages"]),
                    end >= seq["prompt"],
                    seq_key=key,
                    pages_version=seq["version"],
                )
            )
            seq["done"] = end
        if chunks:
            yield chunks


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("seed", range(4))
def test_metadata_equals_per_row_construction(seed, page):
    buffers = StepBuffers(page)
    kinds = set()
    for chunks in random_steps(seed, page, steps=40):
        meta = paged_kv_metadata(buffers.build(chunks), page)
        expected = per_row(chunks, page)
        for name in ("max_q_len", "max_kv_len"):
            assert getattr(meta, name) == expected[name], name
        for name, want in expected.items():
            if name in ("max_q_len", "max_kv_len"):
                continue
            got = getattr(meta, name)
            assert got.dtype == np.int32, name
            assert got.tolist() == want, name
        assert meta.page_size == page
        assert meta.num_chunks == len(chunks)
        assert meta.block_table.flags.c_contiguous
        assert ((meta.last_page_len >= 1) & (meta.last_page_len <= page)).all()
        buffers.check_invariants()
        for c in chunks:
            kinds.add("decode" if len(c.token_ids) == 1 and c.start else "")
            kinds.add("chunked" if len(c.token_ids) > 1 and c.start else "")
            kinds.add("prefill" if c.start == 0 else "")
    assert {"decode", "chunked", "prefill"} <= kinds  # every kind of row was exercised
