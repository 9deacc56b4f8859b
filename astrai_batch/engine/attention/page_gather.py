"""Gathering a batch's KV pages into reusable buffers.

Attention reads each sequence's keys and values from scattered pages; `gather` copies whole
pages (page_size * kv_heads * head_dim contiguous values each), several times faster on CPU
than a per-slot gather. A single table that is one run of consecutive pages (a seat of the
contiguous layout) is returned as a view of the pool: nothing to copy. The destination
buffers are kept and reused across layers and steps: a decode batch's gathered context is
tens of MB, and a fresh tensor that large is a fresh mmap whose pages the kernel zero-fills
on first touch. Measured on the 2-core CI machine, 224 sequences x 304 tokens of SmolLM2
keys: 17 ms per fresh gather vs 4.5 ms into a kept buffer, and the whole decode attention
of a layer 46 ms vs 17 ms.

`gather_heads` gathers head-major instead ([N, kv_heads, keys, head_dim] contiguous, one
head_dim row per key and head) on the CPU below float32: torch's CPU flash kernel runs a
bfloat16 or float16 call faster on contiguous keys and values than on the page gather's
transposed view, with the same bits. Measured in a job's decode step on AMD Zen 4
(SmolLM2, 64 decodes x 384 keys, bfloat16): the kernel 3.70 -> 2.78 ms a layer, each gather
0.53 -> 0.73 ms (128-byte rows instead of whole pages). In float32 the same kernel call is
slower on contiguous keys (5.8-6.3 vs 3.1-3.6 ms, 64 x 384 keys alone), so the page gather
stays there.
"""

from __future__ import annotations

import torch

GROWTH = 1.5  # a growing context regrows the buffer every few steps, not every step


class PageGatherer:
    """Named destination buffers; a gather's result is valid until the next gather of its name.

    Owned by one ModelRunner and used by one step at a time. Buffers only grow: their size is
    the largest gather a step has needed, which the step needed transiently anyway.
    """

    def __init__(self, head_major: bool | None = None) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._head_major = head_major  # None: by the cache's dtype and device

    def gather(
        self, name: str, cache: torch.Tensor, page_tables: torch.Tensor, page_size: int
    ) -> torch.Tensor:
        """[N, pages] page ids -> [N, pages * page_size, kv_heads, head_dim] keys or values."""
        slots, heads, dim = cache.shape
        by_page = cache.view(slots // page_size, page_size * heads * dim)
        rows, pages = page_tables.shape
        first = _consecutive_run_start(page_tables)
        if first is not None:  # one run of pages (a contiguous seat): read it in place
            return by_page[first : first + pages].view(1, pages * page_size, heads, dim)
        out = self._buffer(name, rows * pages, by_page)
        torch.index_select(by_page, 0, page_tables.reshape(-1), out=out)
        return out.view(rows, pages * page_size, heads, dim)

    def gather_heads(
        self,
        name: str,
        cache: torch.Tensor,
        page_tables: torch.Tensor,
        page_size: int,
        keys: int | None = None,
        memo: dict | None = None,
    ) -> torch.Tensor:
        """[N, pages] page ids -> [N, kv_heads, keys, head_dim] (`keys`: all the pages' keys
        when None): head-major and contiguous where that is faster (`head_major`), else a
        view of the page gather. `memo`: the step's row indexes by table, so its layers build
        each once; the caller keeps it (and the tables) for one step only."""
        slots, heads, dim = cache.shape
        keys = page_tables.shape[1] * page_size if keys is None else keys
        if not self.head_major(cache):
            gathered = self.gather(name, cache, page_tables, page_size)
            return gathered[:, :keys].transpose(1, 2)
        key = (id(page_tables), keys, page_size, heads)
        rows = None if memo is None else memo.get(key)
        if rows is None:
            rows = _head_major_rows(page_tables, keys, page_size, heads)
            if memo is not None:
                memo[key] = rows
        by_row = cache.view(slots * heads, dim)
        out = self._buffer(name + " rows", rows.numel(), by_row)
        torch.index_select(by_row, 0, rows, out=out)
        return out.view(page_tables.shape[0], heads, keys, dim)

    def head_major(self, cache: torch.Tensor) -> bool:
        """Whether `gather_heads` gathers head-major: torch's CPU kernels below float32."""
        if self._head_major is not None:
            return self._head_major
        return cache.device.type == "cpu" and cache.element_size() < 4

    def reserved_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _buffer(self, name: str, num_pages: int, by_page: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if (
            buffer is None
            or buffer.shape[0] < num_pages
            or buffer.shape[1] != by_page.shape[1]
            or buffer.dtype != by_page.dtype
            or buffer.device != by_page.device
        ):
            rows = max(num_pages, int(num_pages * GROWTH) if buffer is not None else num_pages)
            del buffer
            self._buffers.pop(name, None)  # free the old one before allocating its successor
            buffer = by_page.new_empty(rows, by_page.shape[1])
            self._buffers[name] = buffer
        return buffer[:num_pages]


def _head_major_rows(
    page_tables: torch.Tensor, keys: int, page_size: int, heads: int
) -> torch.Tensor:
    """The cache rows (slot * kv_heads + head) of each table's first `keys` keys, ordered
    [N, kv_heads, keys]."""
    offsets = torch.arange(keys, device=page_tables.device)
    slots = page_tables[:, offsets // page_size] * page_size + offsets % page_size
    head = torch.arange(heads, device=page_tables.device)
    return (slots[:, None, :] * heads + head[None, :, None]).reshape(-1)


def _consecutive_run_start(page_tables: torch.Tensor) -> int | None:
    """The first page when `page_tables` is one row of consecutive pages on the CPU, else None.

    Only CPU tables are inspected: on an accelerator the check would wait for the device.
    """
    if page_tables.shape[0] != 1 or page_tables.device.type != "cpu" or page_tables.numel() == 0:
        return None
    row = page_tables[0]
    first = int(row[0])
    if int(row[-1]) - first != row.numel() - 1:
        return None
    if row.numel() > 2 and not bool((row[1:] - row[:-1] == 1).all()):
        return None
    return first
