"""Prefix-aware sharding: which worker runs which rows when a job is spread over N workers.

A *prefix group* is the set of rows whose first full page of prompt tokens is identical (the
same definition `planning` uses; a row shorter than a page is a group of its own). Rows of a
group share at least one cached page, so the whole group goes to one worker: splitting it
would make every worker that holds a part compute the shared pages again.

Shards are balanced by estimated work, not by row count: a group's work is the prefill it
needs once shared pages are reused (rows in sorted order, each computing what it does not
share with the row before it, in whole pages) plus the tokens its rows may generate. A group
whose work exceeds a worker's share (total / workers) by half again is split at a subtree
boundary: the first page at which its rows branch. Each subtree ("piece") keeps all of its
own sharing; only the pages above the branch point are computed once per worker that holds
a piece.
Assignment is longest-processing-time first (largest item to the least loaded shard), with
ties broken by keys, so the same input always gives the same shards, which is what lets a
rerun skip the shards that are already done.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.jobs.planning.prefix_order import adapter_order
from astrai_batch.jobs.planning.prefix_stats import packed_ids

KEY_BYTES = 12
# Part of a sharded job's identity: a change to how rows are assigned must not let a rerun
# take shards that an older assignment finished.
SHARDING_VERSION = 2  # 2: a group's key and order start with its LoRA adapter
# A group up to this many times a worker's share stays whole: splitting it costs its shared
# pages once more per extra worker, while a somewhat uneven shard costs little.
SPLIT_ABOVE = 1.5


def page_key(token_ids: Sequence[int], pages: int, page_size: int) -> str:
    """A short stable hash of the first `pages` full pages of `token_ids` (an image's content
    ids packed as `prefix_stats` packs them)."""
    prefix = packed_ids(token_ids[: pages * page_size])
    return hashlib.blake2b(prefix.tobytes(), digest_size=KEY_BYTES).hexdigest()


def group_key(
    index: int, token_ids: Sequence[int], page_size: int, adapter: str | None = None
) -> str:
    """The prefix group of a row: its adapter and first page (rows of two adapters never
    share pages, as in `prefix_order.plan_window`), or the row itself when shorter than one
    page."""
    if len(token_ids) < page_size:
        return f"row-{index}"
    key = page_key(token_ids, 1, page_size)
    return key if adapter is None else f"{key}@{adapter}"


def group_sort_key(token_ids: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Where the group of this row comes in sorted token order (how `planning` numbers it)."""
    return tuple(token_ids[:page_size])


@dataclass(frozen=True)
class KeyedRow:
    """What sharding needs of one runnable row."""

    index: int
    token_ids: tuple[int, ...]
    max_new_tokens: int  # tokens the row may generate, over all its samples
    adapter: str | None = None  # the row's LoRA adapter; None: the base model


@dataclass(frozen=True)
class Piece:
    """A subtree of a group: the rows that share the group's first `depth` pages."""

    key: str
    rows: int
    work: int


@dataclass(frozen=True)
class GroupSummary:
    """One prefix group, reduced to what the assignment needs (a few ints per group)."""

    key: str
    sort_key: tuple[int, ...]
    first_index: int
    rows: int
    work: int
    split_depth: int  # pages; 0 when the rows never branch (no subtree boundary)
    pieces: tuple[Piece, ...]  # in sorted order; empty when split_depth is 0
    adapter: str | None = None  # every row of a group has the same

    def order_key(self) -> tuple[tuple[bool, str], tuple[int, ...], int]:
        return (adapter_order(self.adapter), self.sort_key, self.first_index)


def estimate_work(rows: Sequence[KeyedRow], page_size: int) -> int:
    """Prefill after page-granular reuse (rows in sorted order) plus tokens to generate."""
    work = 0
    previous: tuple[int, ...] = ()
    for row in sorted(rows, key=lambda r: (r.token_ids, r.index)):
        shared = _common_pages(previous, row.token_ids, page_size) * page_size
        # The last prompt token is always computed (it gives the first output's logits).
        reusable = min(shared, ((len(row.token_ids) - 1) // page_size) * page_size)
        work += len(row.token_ids) - max(reusable, 0) + row.max_new_tokens
        previous = row.token_ids
    return work


def summarize_group(key: str, rows: Sequence[KeyedRow], page_size: int) -> GroupSummary:
    """The summary of one group (all its rows given); finds its first branch point."""
    if not rows:
        raise AstraiBatchError(f"prefix group {key} has no rows")
    ordered = sorted(rows, key=lambda r: (r.token_ids, r.index))
    depth = _first_branch_depth(ordered, page_size)
    pieces: tuple[Piece, ...] = ()
    if depth:
        members: dict[str, list[KeyedRow]] = {}
        first = page_key(ordered[-1].token_ids, depth, page_size)
        for row in ordered:
            if len(row.token_ids) >= depth * page_size:
                first = page_key(row.token_ids, depth, page_size)
                break
        for row in ordered:
            members.setdefault(piece_key(row.token_ids, depth, page_size, first), []).append(row)
        pieces = tuple(
            Piece(name, len(part), estimate_work(part, page_size)) for name, part in members.items()
        )
    return GroupSummary(
        key=key,
        sort_key=group_sort_key(ordered[0].token_ids, page_size),
        first_index=min(row.index for row in rows),
        rows=len(rows),
        work=estimate_work(ordered, page_size),
        split_depth=depth,
        pieces=pieces,
        adapter=ordered[0].adapter,
    )


def piece_key(token_ids: Sequence[int], depth: int, page_size: int, first_piece: str) -> str:
    """The piece of a split group a row belongs to. Rows ending above the branch point (a
    prefix of the others) go with the first piece, where sorted order puts them."""
    if len(token_ids) < depth * page_size:
        return first_piece
    return page_key(token_ids, depth, page_size)


def summarize_rows(rows: Iterable[KeyedRow], page_size: int) -> list[GroupSummary]:
    """Group rows in memory and summarize every group (for `plan` and tests)."""
    groups: dict[str, list[KeyedRow]] = {}
    for row in rows:
        key = group_key(row.index, row.token_ids, page_size, row.adapter)
        groups.setdefault(key, []).append(row)
    return [summarize_group(key, members, page_size) for key, members in groups.items()]


@dataclass(frozen=True)
class SplitGroup:
    depth: int
    first_piece: str
    shards: Mapping[str, int]  # piece key -> shard


@dataclass(frozen=True)
class ShardPlan:
    """Where every group goes, and each group's global prefix-group number."""

    workers: int
    page_size: int
    whole: Mapping[str, int]  # group key -> shard
    split: Mapping[str, SplitGroup]
    group_numbers: Mapping[str, int]
    loads: tuple[int, ...]  # estimated work per shard

    def route(self, key: str, token_ids: Sequence[int]) -> int:
        """The shard of a row of group `key`."""
        shard = self.whole.get(key)
        if shard is not None:
            return shard
        split = self.split.get(key)
        if split is None:
            raise AstraiBatchError(f"prefix group {key} is not in the shard plan")
        return split.shards[piece_key(token_ids, split.depth, self.page_size, split.first_piece)]

    def check_invariants(self) -> None:
        if set(self.whole) & set(self.split):
            raise AstraiBatchError("a group is both whole and split")
        if set(self.group_numbers) != set(self.whole) | set(self.split):
            raise AstraiBatchError("group numbers do not cover the planned groups")
        shards = set(self.whole.values()) | {
            s for split in self.split.values() for s in split.shards.values()
        }
        if not shards <= set(range(self.workers)):
            raise AstraiBatchError(f"shards {sorted(shards)} outside 0..{self.workers - 1}")
        numbers = sorted(self.group_numbers.values())
        if numbers != list(range(len(numbers))):
            raise AstraiBatchError("group numbers are not dense from 0")


def assign_shards(groups: Sequence[GroupSummary], workers: int, page_size: int) -> ShardPlan:
    """Balance `groups` over `workers` shards by estimated work (see the module docstring)."""
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    share = sum(group.work for group in groups) / workers
    # (work, tie-break, group key, piece key or "") in assignment order.
    items: list[tuple[int, tuple[tuple[bool, str], tuple[int, ...], int], str, str]] = []
    for group in groups:
        if workers > 1 and group.work > SPLIT_ABOVE * share and len(group.pieces) >= 2:
            items.extend((p.work, group.order_key(), group.key, p.key) for p in group.pieces)
        else:
            items.append((group.work, group.order_key(), group.key, ""))
    items.sort(key=lambda item: (-item[0], item[1], item[3]))
    heap = [(0, shard) for shard in range(workers)]
    loads = [0] * workers
    whole: dict[str, int] = {}
    pieces: dict[str, dict[str, int]] = {}
    for work, _, key, piece in items:
        load, shard = heapq.heappop(heap)
        loads[shard] = load + work
        heapq.heappush(heap, (load + work, shard))
        if piece:
            pieces.setdefault(key, {})[piece] = shard
        else:
            whole[key] = shard
    by_key = {group.key: group for group in groups}
    split = {
        key: SplitGroup(by_key[key].split_depth, by_key[key].pieces[0].key, shards)
        for key, shards in pieces.items()
    }
    ordered = sorted(groups, key=GroupSummary.order_key)
    numbers = {group.key: number for number, group in enumerate(ordered)}
    plan = ShardPlan(workers, page_size, whole, split, numbers, tuple(loads))
    plan.check_invariants()
    return plan


def input_order_blocks(rows: int, workers: int) -> list[range]:
    """Rows cut into `workers` consecutive blocks of near-equal size (what a row-count split
    in input order gives, for contrast with prefix-aware shards)."""
    size, extra = divmod(rows, workers)
    blocks, start = [], 0
    for block in range(workers):
        end = start + size + (1 if block < extra else 0)
        blocks.append(range(start, end))
        start = end
    return blocks


def _common_pages(a: Sequence[int], b: Sequence[int], page_size: int) -> int:
    pages = 0
    limit = min(len(a), len(b)) // page_size
    while pages < limit:
        lo, hi = pages * page_size, (pages + 1) * page_size
        if a[lo:hi] != b[lo:hi]:
            break
        pages += 1
    return pages


def _first_branch_depth(ordered: Sequence[KeyedRow], page_size: int) -> int:
    """The shallowest page (1-based) at which two rows of a sorted group differ; 0 if none."""
    depth = 0
    for before, after in itertools.pairwise(ordered):
        common = _common_pages(before.token_ids, after.token_ids, page_size)
        reach = min(len(before.token_ids), len(after.token_ids)) // page_size
        if common < reach and (depth == 0 or common + 1 < depth):
            depth = common + 1
    return depth
