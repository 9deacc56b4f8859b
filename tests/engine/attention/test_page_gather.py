"""Page gathers into kept buffers: the same values as a plain gather, without reallocating."""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.page_gather import PageGatherer

PAGE, HEADS, DIM = 4, 2, 3


def pool(num_pages: int) -> torch.Tensor:
    return torch.arange(num_pages * PAGE * HEADS * DIM, dtype=torch.float32).view(-1, HEADS, DIM)


def plain_gather(cache: torch.Tensor, tables: list[list[int]]) -> torch.Tensor:
    rows = [torch.cat([cache[p * PAGE : (p + 1) * PAGE] for p in table]) for table in tables]
    return torch.stack(rows)


def test_gather_equals_a_plain_gather_and_reuses_its_buffer():
    cache = pool(10)
    gatherer = PageGatherer()
    tables = [[3, 1, 7], [0, 9, 2]]
    first = gatherer.gather("key", cache, torch.tensor(tables), PAGE)
    assert first.shape == (2, 3 * PAGE, HEADS, DIM)
    assert torch.equal(first, plain_gather(cache, tables))
    reserved = gatherer.reserved_bytes()
    assert reserved == 6 * PAGE * HEADS * DIM * 4
    second = gatherer.gather("key", cache, torch.tensor([[5, 4]]), PAGE)
    assert torch.equal(second, plain_gather(cache, [[5, 4]]))
    assert second.data_ptr() == first.data_ptr()  # the same memory, no new allocation
    assert gatherer.reserved_bytes() == reserved


def test_names_are_separate_buffers_and_a_larger_gather_grows_by_half():
    cache = pool(20)
    gatherer = PageGatherer()
    keys = gatherer.gather("key", cache, torch.tensor([[2, 1]]), PAGE)
    values = gatherer.gather("value", cache, torch.tensor([[4, 3]]), PAGE)
    assert keys.data_ptr() != values.data_ptr()
    assert torch.equal(keys, plain_gather(cache, [[2, 1]]))  # not overwritten by "value"
    tables = [[i, i + 1] for i in range(0, 8, 2)]  # 8 pages > the 2 kept for "key"
    grown = gatherer.gather("key", cache, torch.tensor(tables), PAGE)
    assert torch.equal(grown, plain_gather(cache, tables))
    page_bytes = PAGE * HEADS * DIM * 4
    assert gatherer.reserved_bytes() == (12 + 2) * page_bytes  # 8 pages x 1.5, plus "value"


def test_one_run_of_consecutive_pages_is_read_in_place():
    """A contiguous-layout seat: the pool's own memory, no copy and no buffer."""
    cache = pool(10)
    gatherer = PageGatherer()
    seat = gatherer.gather("key", cache, torch.tensor([[4, 5, 6]]), PAGE)
    assert torch.equal(seat, plain_gather(cache, [[4, 5, 6]]))
    assert seat.data_ptr() == cache[4 * PAGE].data_ptr()
    assert gatherer.reserved_bytes() == 0
    for tables in ([[4, 6, 5]], [[4, 5], [6, 7]], [[4, 5, 7]]):  # not one consecutive run
        gathered = gatherer.gather("key", cache, torch.tensor(tables), PAGE)
        assert torch.equal(gathered, plain_gather(cache, tables))
        assert gathered.data_ptr() != cache[tables[0][0] * PAGE].data_ptr()
