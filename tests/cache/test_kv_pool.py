from __future__ import annotations

import os
import sys

import pytest
import torch

from astrai_batch.cache import KVPool
from astrai_batch.errors import ConfigError

SHAPE = {"num_layers": 2, "num_kv_heads": 4, "head_dim": 8, "page_size": 16}


def reference_slots(page_table: list[int], positions: list[int], page_size: int) -> list[int]:
    return [page_table[p // page_size] * page_size + p % page_size for p in positions]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensors_have_the_requested_layout_dtype_and_device(dtype: torch.dtype) -> None:
    pool = KVPool(**SHAPE, num_pages=3, dtype=dtype, device="cpu")
    assert len(pool.key_cache) == 2
    assert len(pool.value_cache) == 2
    for tensor in (*pool.key_cache, *pool.value_cache):
        assert tensor.shape == (48, 4, 8)
        assert tensor.dtype == dtype
        assert tensor.device == torch.device("cpu")
        assert not tensor.any()
    assert pool.num_pages == 3
    assert pool.page_size == 16
    assert pool.num_slots == 48
    # Keys and values of every layer are separate tensors, not views of one another.
    assert len({t.data_ptr() for t in (*pool.key_cache, *pool.value_cache)}) == 4


def test_bytes_per_page_counts_keys_and_values_of_every_layer() -> None:
    assert KVPool.bytes_per_page(**SHAPE, dtype=torch.float16) == 2 * 2 * 16 * 4 * 8 * 2
    assert KVPool.bytes_per_page(**SHAPE, dtype=torch.float32) == 8192


def test_memory_budget_gives_the_largest_pool_that_fits() -> None:
    pool = KVPool.from_memory_budget(
        10 * 4096 + 4095, **SHAPE, dtype=torch.float16, device=torch.device("cpu")
    )
    assert pool.num_pages == 10
    assert pool.memory_bytes == 10 * 4096
    assert pool.memory_bytes == 10 * KVPool.bytes_per_page(**SHAPE, dtype=torch.float16)


@pytest.mark.parametrize("budget", [4095, 0, -1])
def test_memory_budget_below_one_page_is_rejected(budget: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^memory_bytes={budget} is less than one KV page \(4096 bytes\)$"
    ):
        KVPool.from_memory_budget(budget, **SHAPE, dtype=torch.float16, device="cpu")


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "page_size"])
def test_shape_fields_must_be_positive(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field} must be >= 1, got 0$"):
        KVPool(**{**SHAPE, field: 0}, num_pages=1, dtype=torch.float32, device="cpu")


def test_slot_indices_of_a_long_prompt_match_the_reference() -> None:
    pool = KVPool(**SHAPE, num_pages=300, dtype=torch.float16, device="cpu")
    generator = torch.Generator().manual_seed(0)
    page_table = torch.randperm(300, generator=generator)[:256]
    positions = torch.arange(4096)
    slots = pool.slot_indices(page_table, positions)
    assert slots.dtype == torch.int64
    assert slots.tolist() == reference_slots(page_table.tolist(), positions.tolist(), 16)
    # A decode step: scattered positions, not starting at 0.
    some = torch.tensor([4095, 17, 0, 2048, 15, 16])
    expected = reference_slots(page_table.tolist(), some.tolist(), 16)
    assert pool.slot_indices(page_table, some).tolist() == expected


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _gib_cpu_pool(num_layers: int, dtype: torch.dtype) -> KVPool:
    return KVPool.from_memory_budget(
        1 << 30,
        num_layers=num_layers,
        num_kv_heads=2,
        head_dim=64,
        page_size=16,
        dtype=dtype,
        device="cpu",
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_cpu_pool_is_resident_only_where_it_is_written() -> None:
    before = _resident_bytes()
    pool = _gib_cpu_pool(4, torch.float32)
    made = _resident_bytes()
    assert pool.memory_bytes > (1 << 30) - pool.bytes_per_page(
        num_layers=4, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float32
    )
    assert made - before < 64 << 20  # a 1 GiB pool, a few pages of bookkeeping resident
    keys = pool.key_cache[2]
    assert torch.equal(keys[:4096], torch.zeros_like(keys[:4096]))
    keys[:4096] = 1.0  # 2 MiB of slots written
    assert _resident_bytes() - made >= 2 << 20
    assert torch.equal(pool.value_cache[2][:4096], torch.zeros_like(keys[:4096]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_cpu_pool_declines_huge_pages() -> None:
    # one written slot costs a 4 KiB page, not a 2 MiB huge page (whose first write may wait
    # for the kernel to compact memory: `zeroed`)
    keys = _gib_cpu_pool(1, torch.bfloat16).key_cache[0]
    made = _resident_bytes()
    for slot in range(0, keys.shape[0], keys.shape[0] // 16):  # 16 writes, 2 MiB regions apart
        keys[slot] = 1.0
    assert _resident_bytes() - made < 1 << 20
    assert keys.sum().item() == 16 * 2 * 64
