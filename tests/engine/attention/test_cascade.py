"""Shared-prefix decode attention equals the padded decode attention."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from astrai_batch.cache import KVPool
from astrai_batch.engine.attention.cascade import partition_decodes
from astrai_batch.engine.attention.cascade_plan import plan_cascade
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk


def test_partition_groups_by_shared_leading_pages():
    tables = [[7, 8, 9], [7, 8, 4], [7, 8, 5, 6], [3, 1], [7, 2], [9]]
    lengths = [40, 35, 50, 20, 17, 5]
    part = partition_decodes(tables, lengths, page_size=16)
    # rows 0, 1, 2, 4 start with page 7; row 4 has 17 tokens so only page 7 can be shared
    assert part.groups == [([0, 1, 2, 4], 1)]
    assert part.rest == [3, 5]


def test_partition_keeps_one_own_token_per_member():
    # both rows fill exactly two shared pages: only the first may be shared
    part = partition_decodes([[1, 2], [1, 2]], [32, 32], page_size=16)
    assert part.groups == [([0, 1], 1)]


def model_and_pool(model_dir, num_pages: int) -> tuple[torch.nn.Module, KVPool]:
    """The tiny model in float32 and a pool of 4-token pages for it."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = model.config
    pool = KVPool(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        page_size=4,
        num_pages=num_pages,
        dtype=torch.float32,
        device="cpu",
    )
    return model, pool


def test_cascade_logits_equal_padded_logits(tiny_llama_dir):
    model, pool = model_and_pool(tiny_llama_dir, num_pages=64)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 300, (12,), generator=generator).tolist()  # 3 shared pages
    tails = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (2, 5, 9)]
    shared_pages = [0, 1, 2]
    tables = [[*shared_pages, 10 + 4 * i, 11 + 4 * i, 12 + 4 * i] for i in range(3)]
    cascade = ModelRunner(model, pool, use_cascade=True)
    padded = ModelRunner(model, pool, use_cascade=False)
    cascade.forward([ScheduledChunk(prefix, 0, shared_pages, False)])
    for tail, table in zip(tails, tables, strict=True):
        cascade.forward([ScheduledChunk(tail[:-1], 12, table, False)])
    decodes = [
        ScheduledChunk(tail[-1:], 12 + len(tail) - 1, table, True)
        for tail, table in zip(tails, tables, strict=True)
    ]
    with_cascade = cascade.forward(decodes).logits
    without = padded.forward(decodes).logits
    torch.testing.assert_close(with_cascade, without, rtol=1e-5, atol=1e-5)
    assert with_cascade.shape == (3, model.config.vocab_size)


@pytest.mark.parametrize("kernel", ["cpu-flash", "explicit"])
def test_batched_groups_buckets_and_chunks_equal_padded_logits(tiny_llama_dir, monkeypatch, kernel):
    # Two groups whose prefixes (3 and 8 pages) fall in different buckets, the larger group
    # split into chunks of two slots, and one sequence that shares nothing.
    monkeypatch.setattr("astrai_batch.engine.attention.cascade_plan.MAX_SLOTS", 2)
    if kernel == "explicit":
        monkeypatch.setattr(
            "astrai_batch.engine.attention.cascade.cpu_flash_with_lse", lambda device: None
        )
    model, pool = model_and_pool(tiny_llama_dir, num_pages=128)
    config = model.config
    generator = torch.Generator().manual_seed(1)

    def tokens(n):
        return torch.randint(3, 300, (n,), generator=generator).tolist()

    runner = ModelRunner(model, pool, use_cascade=True)
    padded = ModelRunner(model, pool, use_cascade=False)
    next_page = 20
    decodes = []
    for prefix_pages, tail_lengths in (([0, 1, 2], (3, 6, 2)), (list(range(3, 11)), (5, 9))):
        prefix = tokens(4 * len(prefix_pages))
        runner.forward([ScheduledChunk(prefix, 0, prefix_pages, False)])
        for n in tail_lengths:
            own = (n + 3) // 4
            table = [*prefix_pages, *range(next_page, next_page + own)]
            next_page += own
            tail = tokens(n)
            runner.forward([ScheduledChunk(tail[:-1], len(prefix), table, False)])
            decodes.append(ScheduledChunk(tail[-1:], len(prefix) + n - 1, table, True))
    lone = tokens(7)
    runner.forward([ScheduledChunk(lone[:-1], 0, [60, 61], False)])
    decodes.append(ScheduledChunk(lone[-1:], 6, [60, 61], True))
    with_cascade = runner.forward(decodes).logits
    without = padded.forward(decodes).logits
    # Split-then-merged softmax rounds differently from one softmax: differences of a few
    # 1e-5 on logits of magnitude ~10 (this tiny model's weights are deliberately large).
    torch.testing.assert_close(with_cascade, without, rtol=1e-5, atol=1e-4)
    assert with_cascade.shape == (6, config.vocab_size)


def test_plan_buckets_prefixes_and_splits_large_groups(monkeypatch):
    monkeypatch.setattr("astrai_batch.engine.attention.cascade_plan.MAX_SLOTS", 2)
    tables = [[0, 1, 2, 9], [0, 1, 2, 8], [0, 1, 2, 7], [3, 4, 5, 6, 10, 11, 12, 13, 14]]
    tables.append([3, 4, 5, 6, 10, 11, 12, 13, 15])
    lengths = [14, 15, 13, 35, 34]
    groups = [([0, 1, 2], 3), ([3, 4], 8)]
    plan = plan_cascade(groups, [10, 11, 12, 13, 14], tables, lengths, 4, HostStaging("cpu"))
    assert plan.token_index.tolist() == [10, 11, 12, 13, 14]
    assert plan.tail_tables.tolist() == [[9], [8], [7], [14], [15]]
    assert [b.prefix_tables.shape[0] for b in plan.buckets] == [2, 1]  # 3 pages vs 8 pages
    first, second = plan.buckets
    assert first.prefix_tables.tolist() == [[0, 1, 2], [0, 1, 2]]  # a group of 3 in 2 chunks
    assert first.slot_members.tolist() == [0, 1, 2, 0]
    assert (first.member_slots.tolist(), first.members.tolist()) == ([0, 1, 2], [0, 1, 2])
    assert (second.prefix_mask == 0).sum().item() == 8 * 4
    assert (second.member_slots.tolist(), second.members.tolist()) == ([0, 1], [3, 4])
