"""How the llama-cpp peer feeds a wave of prompts to llama.cpp: the shared-prefix prefill plan.

llama.cpp's best configuration for a shared-prefix workload on a CPU is one context with a
unified KV cache (`kv_unified`: one buffer for every sequence, so a cell can belong to several
sequences) and a batch whose tokens carry several sequence ids. The wave's prompts form a
prefix tree; each node of the tree (a token at a position, under a given prefix) is decoded
once, tagged with the ids of every prompt passing through it, so a system prompt shared by
eight questions is computed and stored once, as our radix cache does. Its alternative,
decoding a prefix on one sequence and then `llama_memory_seq_cp` to the others, gives the
same cells but needs a `llama_decode` barrier before every copy.

This module is plain Python (no llama.cpp) so its arithmetic is tested in the suite.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedToken:
    token: int
    position: int
    seq_ids: tuple[int, ...]  # the wave's prompts (their index in the wave) sharing this cell
    ends: tuple[int, ...]  # prompts whose last prompt token this is: logits wanted


def prefill_plan(prompts: Sequence[Sequence[int]], chunk_tokens: int) -> list[list[PlannedToken]]:
    """The wave's prefix tree in depth-first order, cut into `llama_decode` calls of at most
    `chunk_tokens` tokens. Depth-first order keeps every sequence's positions increasing
    within and across calls, as llama.cpp's batch checks require."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token")
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    # adjacent[r]: the common prefix of the r-th and (r+1)-th prompts in sorted order; the
    # prompts sharing a cell with rank r at position p are the ranks after r while the running
    # minimum of `adjacent` stays above p.
    adjacent = [_common(prompts[a], prompts[b]) for a, b in itertools.pairwise(order)]
    tokens: list[PlannedToken] = []
    for rank, index in enumerate(order):
        prompt = prompts[index]
        start = adjacent[rank - 1] if rank else 0  # cells the previous prompt already emitted
        reach = []  # reach[k]: the common prefix of this prompt and the one k + 1 ranks later
        for later in range(rank, len(order) - 1):
            shared = min(reach[-1], adjacent[later]) if reach else adjacent[later]
            if shared <= start:
                break
            reach.append(shared)
        for position in range(start, len(prompt)):
            while reach and reach[-1] <= position:
                reach.pop()  # non-increasing: the farthest sharer drops out first
            sharing = [order[rank + k] for k in range(len(reach) + 1)]
            ends = tuple(sorted(i for i in sharing if len(prompts[i]) == position + 1))
            tokens.append(PlannedToken(prompt[position], position, tuple(sorted(sharing)), ends))
    return [tokens[start : start + chunk_tokens] for start in range(0, len(tokens), chunk_tokens)]


def prefix_tree_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Cells the plan decodes: the distinct (prefix, token) nodes of the prompts' tree."""
    order = sorted(tuple(prompt) for prompt in prompts)
    total, previous = 0, ()
    for prompt in order:
        total += len(prompt) - _common(previous, prompt)
        previous = prompt
    return total


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
