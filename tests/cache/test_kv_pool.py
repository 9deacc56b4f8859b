from __future__ import annotations

import pytest
import torch

from astrai_batch.cache import CacheUsageError, KVPool
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
    with pytest.raises(ConfigError, match=rf"^{field} must be a positive integer, got 0$"):
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


def test_batched_slot_indices_match_the_reference_and_zero_the_padding() -> None:
    pool = KVPool(**SHAPE, num_pages=600, dtype=torch.float16, device="cpu")
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(600, generator=generator).tolist()
    rows = [order[:256], order[256:258], order[258:259]]
    lengths = [4096, 17, 0]
    page_tables = torch.zeros((3, 256), dtype=torch.int64)
    for row, pages in enumerate(rows):
        page_tables[row, : len(pages)] = torch.tensor(pages)
    slots = pool.batched_slot_indices(page_tables, torch.tensor(lengths))
    assert slots.shape == (3, 4096)
    for row, (pages, length) in enumerate(zip(rows, lengths, strict=True)):
        expected = reference_slots(pages, list(range(length)), 16) + [0] * (4096 - length)
        assert slots[row].tolist() == expected


def test_batched_slot_indices_of_an_empty_batch() -> None:
    pool = KVPool(**SHAPE, num_pages=2, dtype=torch.float32, device="cpu")
    slots = pool.batched_slot_indices(
        torch.zeros((0, 2), dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    )
    assert slots.shape == (0, 0)


def test_batched_slot_indices_reject_lengths_beyond_the_page_tables() -> None:
    pool = KVPool(**SHAPE, num_pages=4, dtype=torch.float32, device="cpu")
    with pytest.raises(
        CacheUsageError, match=r"^a length of 33 tokens needs more than the 2 pages per row given$"
    ):
        pool.batched_slot_indices(torch.tensor([[0, 1]]), torch.tensor([33]))


def test_store_writes_where_slot_indices_point() -> None:
    pool = KVPool(**SHAPE, num_pages=4, dtype=torch.float16, device="cpu")
    page_table = torch.tensor([3, 1])
    positions = torch.arange(20)
    slots = pool.slot_indices(page_table, positions)
    keys = torch.arange(20 * 4 * 8, dtype=torch.float32).reshape(20, 4, 8)
    pool.store(1, slots, keys, -keys)
    assert torch.equal(pool.key_cache[1][48:64], keys[:16].half())
    assert torch.equal(pool.key_cache[1][16:20], keys[16:].half())
    assert torch.equal(pool.value_cache[1][slots], -keys.half())
    assert not pool.key_cache[0].any()
    assert not pool.key_cache[1][:16].any()
