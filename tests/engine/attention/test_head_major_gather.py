"""Head-major key gathers (`PageGatherer.gather_heads`) give the attention the same bits as the
page gather's transposed view, in the dtypes the engine uses them for.

On the CPU below float32 the gatherer hands torch's flash kernel contiguous [elements,
kv_heads, keys, head_dim] keys and values (faster there) instead of a view of whole gathered
pages; the kernel must not tell the two apart, or a job's output would depend on the gather
as well as on its arithmetic (the invariant flash path over random steps).
"""

from __future__ import annotations

import random

import pytest
import torch
from attention_kit import GROUP, PAGE, SCALE, Pool, random_steps, step_for

from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer


def test_gather_heads_puts_each_key_and_head_in_its_place():
    slots, heads, dim, page = 12 * 16, 3, 4, 16
    # each row holds its own slot and head, so the output names where it came from
    cache = torch.zeros(slots, heads, dim, dtype=torch.bfloat16)
    cache[:, :, 0] = torch.arange(slots, dtype=torch.bfloat16)[:, None]
    cache[:, :, 1] = torch.arange(heads, dtype=torch.bfloat16)[None, :]
    tables = torch.tensor([[7, 2, 0], [3, 9, 4]])
    gatherer = PageGatherer()
    assert gatherer.head_major(cache)
    out = gatherer.gather_heads("key", cache, tables, page, keys=37)
    assert out.shape == (2, heads, 37, dim) and out.is_contiguous()
    for n, table in enumerate(tables.tolist()):
        for head in range(heads):
            for key in range(37):
                slot = table[key // page] * page + key % page
                assert out[n, head, key, 0] == slot and out[n, head, key, 1] == head
    paged = PageGatherer(head_major=False).gather_heads("key", cache, tables, page, keys=37)
    assert torch.equal(paged, out)
    assert not PageGatherer().head_major(cache.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [64, 512])
def test_flash_blocks_get_the_page_gathers_bits(dtype, block):
    seed = 11 + block
    pool = Pool(seed)
    keys, values = pool.keys.to(dtype), pool.values.to(dtype)
    rng = random.Random(seed)
    rules = FlashRules(GROUP, tuple(range(64, block + 1, 64)), block)  # any tails: same plan
    for chunks in random_steps(rng)[:12]:
        step, queries = step_for(pool, chunks)
        staging = HostStaging("cpu")
        calls, merge = plan_flash_step(step, PAGE, rules, dtype, staging)
        outs, memo = [], {}
        for head_major, row_memo in ((False, None), (True, None), (True, memo), (True, memo)):
            batch = FlashBlockBatch(
                [keys], [values], PAGE, staging.array(step.write_slots), 0, calls, merge,
                PageGatherer(head_major), row_memo=row_memo,
            )  # fmt: skip
            outs.append(flash_block_attention(queries.to(dtype), keys, values, batch, SCALE))
        assert all(torch.equal(outs[0], out) for out in outs[1:]), (seed, chunks)
        # one index per call's tables, built by the first "layer" and read by the second
        assert len(memo) == len(calls)
