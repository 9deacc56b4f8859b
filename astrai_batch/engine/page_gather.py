"""Gathering a batch's KV pages into reusable buffers.

Attention reads each sequence's keys and values from scattered pages; `gather` copies whole
pages (page_size * kv_heads * head_dim contiguous values each), several times faster on CPU
than a per-slot gather. The destination buffers are kept and reused across layers and steps:
a decode batch's gathered context is tens of MB, and a fresh tensor that large is a fresh
mmap whose pages the kernel zero-fills on first touch. Measured on the 2-core CI machine, 224
sequences x 304 tokens of SmolLM2 keys: 17 ms per fresh gather vs 4.5 ms into a kept buffer,
and the whole decode attention of a layer 46 ms vs 17 ms.
"""

from __future__ import annotations

import torch

GROWTH = 1.5  # a growing context regrows the buffer every few steps, not every step


class PageGatherer:
    """Named destination buffers; a gather's result is valid until the next gather of its name.

    Owned by one ModelRunner and used by one step at a time. Buffers only grow: their size is
    the largest gather a step has needed, which the step needed transiently anyway.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def gather(
        self, name: str, cache: torch.Tensor, page_tables: torch.Tensor, page_size: int
    ) -> torch.Tensor:
        """[N, pages] page ids -> [N, pages * page_size, kv_heads, head_dim] keys or values."""
        slots, heads, dim = cache.shape
        by_page = cache.view(slots // page_size, page_size * heads * dim)
        rows, pages = page_tables.shape
        out = self._buffer(name, rows * pages, by_page)
        torch.index_select(by_page, 0, page_tables.reshape(-1), out=out)
        return out.view(rows, pages * page_size, heads, dim)

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
