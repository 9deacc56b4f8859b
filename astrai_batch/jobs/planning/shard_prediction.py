"""What sharding does to prefix reuse, predicted without running a model (`plan --workers`).

Each shard runs on its own engine with its own cache, so a prefix is reused only by rows of
the same shard. The predicted hit rate of a split is the ideal page-granular reuse inside
each shard (`prefix_stats`), summed over shards, over all prompt tokens. Two splits are
compared: our prefix-aware shards (`sharding.assign_shards`) and blocks of rows in input
order, which is how a row-count split such as Ray Data's default blocks cuts a dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from astrai_batch.jobs.planning.prefix_stats import ideal_prefix_stats
from astrai_batch.jobs.planning.sharding import (
    KeyedRow,
    assign_shards,
    group_key,
    input_order_blocks,
    summarize_rows,
)


@dataclass(frozen=True)
class ShardPrediction:
    workers: int
    one_worker_hit_rate: float
    prefix_aware_hit_rate: float
    input_order_hit_rate: float
    prefix_aware_loads: tuple[int, ...]  # estimated work per shard

    def to_dict(self) -> dict[str, object]:
        return {
            "workers": self.workers,
            "one_worker_hit_rate": self.one_worker_hit_rate,
            "prefix_aware_hit_rate": self.prefix_aware_hit_rate,
            "input_order_hit_rate": self.input_order_hit_rate,
            "prefix_aware_work_per_shard": list(self.prefix_aware_loads),
        }


def split_hit_rate(shards: Sequence[Sequence[KeyedRow]], page_size: int) -> float:
    reusable = prompt = 0
    for rows in shards:
        stats = ideal_prefix_stats((row.token_ids for row in rows), page_size=page_size, top=0)
        reusable += stats.reusable_tokens
        prompt += stats.prompt_tokens
    return reusable / prompt if prompt else 0.0


def predict_shards(rows: Sequence[KeyedRow], workers: int, page_size: int) -> ShardPrediction:
    """Hit rates of one worker, of prefix-aware shards and of input-order blocks."""
    plan = assign_shards(summarize_rows(rows, page_size), workers, page_size)
    aware: list[list[KeyedRow]] = [[] for _ in range(workers)]
    for row in rows:
        aware[plan.route(group_key(row.index, row.token_ids, page_size), row.token_ids)].append(row)
    ordered = sorted(rows, key=lambda row: row.index)
    blocks = [[ordered[i] for i in block] for block in input_order_blocks(len(ordered), workers)]
    return ShardPrediction(
        workers=workers,
        one_worker_hit_rate=split_hit_rate([ordered], page_size),
        prefix_aware_hit_rate=split_hit_rate(aware, page_size),
        input_order_hit_rate=split_hit_rate(blocks, page_size),
        prefix_aware_loads=plan.loads,
    )
