"""The step's cascade metadata: every shared-prefix decode group batched into a few tensors.

Attention per group costs a few dozen small operators per layer; with eight groups and thirty
layers that overhead outweighed the arithmetic. Instead all members' own tails are attended in
one padded batch, and the groups' shared prefixes in one batch per *bucket* of groups with
similar prefix lengths (so that padding the prefixes to the longest costs at most 2x). A group
larger than the bucket's slot count is split into chunks that read the same prefix pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from astrai_batch.engine.attention.host_staging import HostStaging

MAX_SLOTS = 64  # queries of one prefix batch row; bounds the padding of uneven groups
PREFIX_SPREAD = 2  # a bucket's longest prefix is at most this many times its shortest


@dataclass(frozen=True)
class PrefixBucket:
    """Groups (or chunks of groups) whose shared prefixes are attended in one batch."""

    prefix_tables: torch.Tensor  # [B, P] shared pages, padded with page 0
    prefix_mask: torch.Tensor  # [B, 1, 1, P * page_size] float: 0 where the key exists, -inf
    slot_members: torch.Tensor  # [B * C] member index of each query slot (padding: 0)
    slots: int  # C, query slots per row
    member_slots: torch.Tensor  # [m] flat slot of each member this bucket serves
    members: torch.Tensor  # [m] the member indices it serves, in `member_slots` order


@dataclass(frozen=True)
class CascadeBatch:
    """All decode sequences attended as shared prefix + own tail this step."""

    token_index: torch.Tensor  # [M] rows of the packed batch, one per member
    tail_tables: torch.Tensor  # [M, T] each member's pages after its prefix, padded with 0
    tail_mask: torch.Tensor  # [M, 1, 1, T * page_size] float: 0 where the key exists, -inf
    buckets: list[PrefixBucket]


def plan_cascade(
    groups: list[tuple[list[int], int]],
    rows: list[int],
    tables: list[list[int]],
    lengths: list[int],
    page_size: int,
    staging: HostStaging,
) -> CascadeBatch | None:
    """`groups` as from `partition_decodes`: (decode indices, shared page count)."""
    if not groups:
        return None
    members: list[int] = []
    chunks: list[tuple[list[int], int, int]] = []  # (member positions, shared, first decode)
    slots = min(MAX_SLOTS, max(len(m) for m, _ in groups))
    for group, shared in groups:
        positions = list(range(len(members), len(members) + len(group)))
        members.extend(group)
        for start in range(0, len(positions), slots):
            chunks.append((positions[start : start + slots], shared, group[0]))
    tails = [tables[i][shared:] for group, shared in groups for i in group]
    tail_lengths = [lengths[i] - shared * page_size for group, shared in groups for i in group]
    tail_tables, tail_mask = padded_tables(tails, tail_lengths, page_size)
    return CascadeBatch(
        token_index=staging.values([rows[i] for i in members], torch.long),
        tail_tables=staging.tensor(tail_tables),
        tail_mask=staging.tensor(additive(tail_mask)),
        buckets=[
            _bucket(bucket, tables, slots, page_size, staging) for bucket in _by_prefix(chunks)
        ],
    )


def _by_prefix(
    chunks: list[tuple[list[int], int, int]],
) -> list[list[tuple[list[int], int, int]]]:
    buckets: list[list[tuple[list[int], int, int]]] = []
    for chunk in sorted(chunks, key=lambda c: c[1]):
        if buckets and chunk[1] <= PREFIX_SPREAD * buckets[-1][0][1]:
            buckets[-1].append(chunk)
        else:
            buckets.append([chunk])
    return buckets


def _bucket(
    chunks: list[tuple[list[int], int, int]],
    tables: list[list[int]],
    slots: int,
    page_size: int,
    staging: HostStaging,
) -> PrefixBucket:
    prefixes = [tables[first][:shared] for _, shared, first in chunks]
    prefix_tables, prefix_mask = padded_tables(
        prefixes, [len(p) * page_size for p in prefixes], page_size
    )
    # built as lists and converted once: this runs every step for up to max_num_seqs members
    slot_members = [0] * (len(chunks) * slots)
    member_slots: list[int] = []
    served: list[int] = []
    for row, (positions, _, _) in enumerate(chunks):
        for offset, member in enumerate(positions):
            slot_members[row * slots + offset] = member
            member_slots.append(row * slots + offset)
            served.append(member)
    return PrefixBucket(
        prefix_tables=staging.tensor(prefix_tables),
        prefix_mask=staging.tensor(additive(prefix_mask)),
        slot_members=staging.values(slot_members, torch.long),
        slots=slots,
        member_slots=staging.values(member_slots, torch.long),
        members=staging.values(served, torch.long),
    )


def padded_tables(
    tables: list[list[int]], lengths: list[int], page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Page tables padded with page 0, and the [n, 1, 1, pages * page_size] key mask."""
    max_pages = max(len(t) for t in tables)
    padded = torch.zeros(len(tables), max_pages, dtype=torch.long)
    for i, table in enumerate(tables):
        padded[i, : len(table)] = torch.tensor(table, dtype=torch.long)
    positions = torch.arange(max_pages * page_size).unsqueeze(0)
    mask = positions < torch.tensor(lengths).unsqueeze(1)
    return padded, mask.view(len(tables), 1, 1, -1)


def additive(mask: torch.Tensor) -> torch.Tensor:
    """A bool key mask (True = attend) as the float mask added to scores."""
    return torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
