"""Shared-prefix ("cascade") attention for decode tokens.

Sequences that share a prompt prefix share its physical pages (the prefix cache stores a page
once). A padded decode attention would gather those pages once per sequence, every layer,
which on CPU costs more than the model's matmuls at large batch. Here decode sequences are
grouped by the run of leading pages they share: each group reads its shared pages once and
scores all its queries against them with one matmul; only each sequence's own tail pages are
gathered per sequence. Scores of both parts are softmaxed together, so the result is the
same attention, not an approximation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from astrai_batch.engine.page_gather import PageGatherer


@dataclass(frozen=True)
class CascadeGroup:
    """Decode sequences whose first `prefix_pages` pages are the same physical pages."""

    token_index: torch.Tensor  # [n] rows of the packed batch
    prefix_pages: torch.Tensor  # [p] the shared pages
    tail_tables: torch.Tensor  # [n, t] each sequence's pages after the prefix, padded with 0
    tail_mask: torch.Tensor  # [n, 1, 1, t * page_size] bool: True where the key exists


@dataclass(frozen=True)
class DecodePartition:
    groups: list[tuple[list[int], int]]  # (member indices, shared page count), >= 2 members
    rest: list[int]  # indices attended without a shared prefix


def partition_decodes(
    tables: Sequence[Sequence[int]], lengths: Sequence[int], page_size: int, min_group: int = 2
) -> DecodePartition:
    """Groups decode sequences by their first page and finds each group's shared page run.

    A shared page must be full for every member and leave each member at least one own token,
    so no row of the tail attention is empty.
    """
    by_first: dict[int, list[int]] = {}
    rest: list[int] = []
    for i, table in enumerate(tables):
        if lengths[i] > page_size:
            by_first.setdefault(table[0], []).append(i)
        else:
            rest.append(i)
    groups = []
    for members in by_first.values():
        if len(members) < min_group:
            rest.extend(members)
            continue
        limit = min((lengths[i] - 1) // page_size for i in members)
        first = tables[members[0]]
        shared = 0
        while shared < limit and all(tables[i][shared] == first[shared] for i in members):
            shared += 1
        groups.append((members, shared))
    rest.sort()
    return DecodePartition(groups=groups, rest=rest)


def cascade_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: CascadeGroup,
    page_size: int,
    scaling: float,
    gatherer: PageGatherer,
) -> torch.Tensor:
    """q: [n, Hkv, G, D] decode queries of one group -> [n, Hkv, G, D]."""
    n, kv_heads, per_kv, dim = q.shape
    prefix = group.prefix_pages.unsqueeze(0)
    kp = gatherer.gather("key_prefix", k_cache, prefix, page_size)[0].transpose(0, 1)
    vp = gatherer.gather("value_prefix", v_cache, prefix, page_size)[0].transpose(0, 1)
    kt = gatherer.gather("key", k_cache, group.tail_tables, page_size).transpose(1, 2)
    vt = gatherer.gather("value", v_cache, group.tail_tables, page_size).transpose(1, 2)
    kp, vp, kt, vt = (x.to(q.dtype) for x in (kp, vp, kt, vt))
    prefix_len = kp.shape[1]
    # all queries of the group against the shared keys: [Hkv, n * G, D] @ [Hkv, D, Lp]
    q_by_head = q.permute(1, 0, 2, 3).reshape(kv_heads, n * per_kv, dim)
    scores_prefix = torch.matmul(q_by_head, kp.transpose(1, 2)).mul_(scaling)
    scores_prefix = scores_prefix.view(kv_heads, n, per_kv, prefix_len).permute(1, 0, 2, 3)
    scores_tail = torch.matmul(q, kt.transpose(2, 3)).mul_(scaling)  # [n, Hkv, G, Lt]
    scores_tail.masked_fill_(~group.tail_mask, float("-inf"))
    probs = torch.cat([scores_prefix, scores_tail], dim=-1).float().softmax(dim=-1).to(q.dtype)
    probs_prefix = probs[..., :prefix_len].permute(1, 0, 2, 3).reshape(kv_heads, n * per_kv, -1)
    out = torch.matmul(probs_prefix, vp).view(kv_heads, n, per_kv, dim).permute(1, 0, 2, 3)
    return out + torch.matmul(probs[..., prefix_len:], vt)
