"""Head-major key gathers (`page_gather.gather_rows`) give the flash attention the same bits as
the page gather, in the dtypes the engine uses them for, across random steps.

Below float32 the engine hands torch's CPU flash kernel contiguous [elements, kv_heads, keys,
head_dim] keys and values (faster there) instead of a transposed view of whole gathered
pages; the kernel must not tell the two apart, or a job's output would depend on the dtype's
gather as well as its arithmetic.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from attention_kit import GROUP, KV_HEADS, PAGE, SCALE, Pool, random_steps, step_for

from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer, head_major_rows
from astrai_batch.engine.runner.attention_batches import with_head_rows


def test_head_major_rows_name_each_key_and_head_in_order():
    tables = np.array([[7, 2, 0], [3, 9, 4]])
    rows = head_major_rows(tables, keys=37, page_size=16, kv_heads=3)
    want = []
    for table in tables:
        for head in range(3):
            for key in range(37):
                slot = int(table[key // 16]) * 16 + key % 16
                want.append(slot * 3 + head)
    assert rows.tolist() == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [64, 512])
def test_head_major_gather_gives_the_page_gathers_bits(dtype, block):
    seed = 11 + block
    pool = Pool(seed)
    keys, values = pool.keys.to(dtype), pool.values.to(dtype)
    rng = random.Random(seed)
    rules = FlashRules(GROUP, tuple(range(64, block + 1, 64)), block)  # any tails: same plan
    for chunks in random_steps(rng)[:12]:
        step, queries = step_for(pool, chunks)
        staging = HostStaging("cpu")
        calls, merge = plan_flash_step(step, PAGE, rules, dtype, staging)
        rows = [with_head_rows(c, PAGE, KV_HEADS, staging) for c in calls]
        assert all(c.head_rows is not None for c in rows)
        outs = []
        for planned in (calls, rows):
            batch = FlashBlockBatch(
                [keys], [values], PAGE, staging.array(step.write_slots), 0, planned, merge,
                PageGatherer(),
            )  # fmt: skip
            outs.append(flash_block_attention(queries.to(dtype), keys, values, batch, SCALE))
        assert torch.equal(outs[0], outs[1]), (seed, chunks)
