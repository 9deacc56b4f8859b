"""Paged K/V tensors: the memory the page allocator hands out.

Each layer's keys (and values) live in one flat tensor of `num_pages * page_size` slots, so a
token at position `p` of a request whose page table is `t` sits in slot
`t[p // page_size] * page_size + p % page_size`. A flat slot axis lets the engine gather or
scatter a whole batch with one `index_select` / `index_copy_` per layer.
"""

from __future__ import annotations

import torch

from astrai_batch.cache.errors import CacheUsageError
from astrai_batch.errors import ConfigError


def _require_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


class KVPool:
    """Per-layer key and value tensors of shape `[num_pages * page_size, num_kv_heads, head_dim]`.

    The tensors are zero-filled: attention masks unused slots with weight 0, and 0 * NaN from
    uninitialised memory would still poison the weighted sum.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        num_pages: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("page_size", page_size),
            ("num_pages", num_pages),
        ):
            _require_positive(name, value)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.key_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.value_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]

    @staticmethod
    def bytes_per_page(
        *, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype
    ) -> int:
        """Bytes one page costs across all layers, keys and values together."""
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("page_size", page_size),
        ):
            _require_positive(name, value)
        element_size = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * page_size * num_kv_heads * head_dim * element_size

    @classmethod
    def from_memory_budget(
        cls,
        memory_bytes: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVPool:
        """The largest pool whose tensors fit in `memory_bytes`."""
        page_bytes = cls.bytes_per_page(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
        )
        num_pages = memory_bytes // page_bytes if memory_bytes > 0 else 0
        if num_pages < 1:
            raise ConfigError(
                f"memory_bytes={memory_bytes} is less than one KV page ({page_bytes} bytes)"
            )
        return cls(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            num_pages=num_pages,
            dtype=dtype,
            device=device,
        )

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def memory_bytes(self) -> int:
        """Bytes held by all key and value tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.key_cache, *self.value_cache))

    def slot_indices(self, page_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat slots of `positions` (LongTensor [T]) for one request's `page_table` ([n_pages])."""
        page_size = self.page_size
        return page_table[positions // page_size] * page_size + positions % page_size

    def batched_slot_indices(
        self, page_tables: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Slots `[N, max(lengths)]` of positions `0..length-1` of each row of `page_tables`.

        `page_tables` is `[N, max_pages]`, rows padded with any valid page id; positions at or
        past a row's length map to slot 0 and are for the caller to mask.
        """
        if page_tables.dim() != 2:
            raise CacheUsageError(
                f"page_tables must be 2-D [N, max_pages], got {page_tables.dim()}-D"
            )
        if lengths.dim() != 1 or lengths.shape[0] != page_tables.shape[0]:
            raise CacheUsageError(
                f"lengths must be 1-D with {page_tables.shape[0]} entries, "
                f"got shape {tuple(lengths.shape)}"
            )
        num_rows, max_pages = page_tables.shape
        max_len = int(lengths.max()) if num_rows else 0
        if max_len > max_pages * self.page_size:
            raise CacheUsageError(
                f"a length of {max_len} tokens needs more than the {max_pages} pages per row given"
            )
        page_size = self.page_size
        positions = torch.arange(max_len, device=page_tables.device)
        slots = page_tables[:, positions // page_size] * page_size + positions % page_size
        valid = positions.unsqueeze(0) < lengths.to(page_tables.device).unsqueeze(1)
        return torch.where(valid, slots, torch.zeros((), dtype=slots.dtype, device=slots.device))

    def store(
        self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Write `keys`/`values` (`[T, num_kv_heads, head_dim]`) of `layer` into `slots` ([T])."""
        self.key_cache[layer].index_copy_(0, slots, keys.to(self.dtype))
        self.value_cache[layer].index_copy_(0, slots, values.to(self.dtype))

    def __repr__(self) -> str:
        return (
            f"KVPool(num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, page_size={self.page_size}, num_pages={self.num_pages}, "
            f"dtype={self.dtype}, device={self.device})"
        )
