"""Paged K/V tensors: the memory the page allocator hands out.

Each layer's keys (and values) live in one flat tensor of `num_pages * page_size` slots, so a
token at position `p` of a request whose page table is `t` sits in slot
`t[p // page_size] * page_size + p % page_size`. A flat slot axis lets the engine gather or
scatter a whole batch with one `index_select` / `index_copy_` per layer.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

from astrai_batch.checks import require_positive_int
from astrai_batch.errors import ConfigError


class KVPool:
    """Per-layer key and value tensors of shape `[num_pages * page_size, num_kv_heads, head_dim]`.

    The tensors are zero-filled: attention masks unused slots with weight 0, and 0 * NaN from
    uninitialised memory would still poison the weighted sum. On CPU the zeros are lazy
    (`zeroed`): the pool becomes resident as pages are written, not when it is made.

    `latent=True` (multi-head latent attention): one vector per token and layer, the
    normalized latent and the roped shared key side by side (`head_dim` = kv_lora_rank +
    qk_rope_head_dim, `num_kv_heads` 1), held in `key_cache`; `value_cache` is empty. Attention
    expands it into each head's key and value itself (`engine.attention.latent_pages`).
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
        latent: bool = False,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("page_size", page_size),
            ("num_pages", num_pages),
        ):
            require_positive_int(name, value)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype must be a torch.dtype, got {dtype!r}")
        if latent and num_kv_heads != 1:
            raise ConfigError(
                f"a latent pool holds one vector per token: num_kv_heads must be 1, "
                f"got {num_kv_heads}"
            )
        self.latent = latent
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.key_cache: list[torch.Tensor] = [
            zeroed(shape, dtype, self.device) for _ in range(num_layers)
        ]
        self.value_cache: list[torch.Tensor] = [
            zeroed(shape, dtype, self.device) for _ in range(0 if latent else num_layers)
        ]

    @staticmethod
    def bytes_per_page(
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        dtype: torch.dtype,
        latent: bool = False,
    ) -> int:
        """Bytes one page costs across all layers, keys and values together (a latent pool:
        its one vector per token)."""
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("page_size", page_size),
        ):
            require_positive_int(name, value)
        element_size = torch.empty((), dtype=dtype).element_size()
        return (
            (1 if latent else 2) * num_layers * page_size * num_kv_heads * head_dim * element_size
        )

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
        latent: bool = False,
    ) -> KVPool:
        """The largest pool whose tensors fit in `memory_bytes`."""
        page_bytes = cls.bytes_per_page(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            latent=latent,
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
            latent=latent,
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

    def __repr__(self) -> str:
        return (
            f"KVPool(num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, page_size={self.page_size}, num_pages={self.num_pages}, "
            f"dtype={self.dtype}, device={self.device}, latent={self.latent})"
        )


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor that, on CPU, costs memory only where it is written.

    `torch.zeros` writes every byte, so a pool sized for the machine is resident at once (8 GiB
    for a job whose sequences use a few MB). An anonymous private mapping instead: the kernel
    zero-fills each 4 KiB page on its first write, and untouched slots stay the shared zero
    page. Huge pages are declined (`MADV_NOHUGEPAGE`): numpy's zeros, used before, advise them
    for large blocks, and with the kernel's default `madvise` defrag every first write into a
    fresh 2 MiB region then waited for memory compaction: on issue 33's workload the pool
    writes took 0.3-0.7 s of a 10 s job, 0.17-0.28 s with 4 KiB pages (docs/performance.md).
    Read as zeros either way.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = 1
    for size in shape:
        count *= size
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # no anonymous mappings (Windows)
        return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    # the tensor holds the mapping (frombuffer keeps its owner alive); unmapped with the tensor
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)
