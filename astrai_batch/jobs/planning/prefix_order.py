"""Prefix grouping inside a window: the order rows run in and which prefix group each is in.

Sorting a window's prompts by their token ids (lexicographically) visits the prefix tree
depth first: prompts sharing a prefix become neighbours, and a prompt that is a prefix of
another runs before it. That is the order in which an LRU radix cache hits best, because
each shared prefix is computed once and reused while it is still resident.

A *prefix group* is the set of rows whose first full page (`page_size` tokens) is
identical. Two rows are in the same group iff they share at least one full page of
prefix, which is exactly when a page-granular prefix cache can let one reuse the other's
work. A row shorter than one page shares no page with anything, so it is a group of its
own, even when another row has identical tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from astrai_batch.checks import require_positive_int
from astrai_batch.errors import AstraiBatchError, ConfigError


@dataclass(frozen=True)
class PlanningOptions:
    """How a job's windows are planned: rows per window, whether prefixes are grouped, and
    the page size that defines a prefix group. Fixed for a job once its checkpoint exists."""

    page_size: int
    grouping: bool
    group_window: int

    def __post_init__(self) -> None:
        for name in ("page_size", "group_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.grouping, bool):
            raise ConfigError(f"grouping must be true or false, got {self.grouping!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PlanningOptions:
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown planning option(s): {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        grouping = "on" if self.grouping else "off"
        return f"page size {self.page_size}, grouping {grouping}, group window {self.group_window}"


@dataclass(frozen=True)
class PlannedRow:
    """One row of a window in execution order."""

    position: int  # position of the row inside the window (its input order)
    prefix_group: int


@dataclass(frozen=True)
class WindowPlan:
    """How one window runs.

    `order` lists window positions in execution order. `prefix_group` is indexed by
    position (input order); group ids are dense, numbered in execution order of each
    group's first row, starting at the `group_offset` given to `plan_window`.
    """

    order: tuple[int, ...]
    prefix_group: tuple[int, ...]
    num_groups: int

    def planned_rows(self) -> tuple[PlannedRow, ...]:
        """The rows in execution order, each with its prefix group."""
        return tuple(PlannedRow(position, self.prefix_group[position]) for position in self.order)

    def check_invariants(self) -> None:
        """Raise AstraiBatchError if the plan is not a permutation with dense group ids."""
        size = len(self.order)
        if sorted(self.order) != list(range(size)):
            raise AstraiBatchError(f"order is not a permutation of range({size}): {self.order}")
        if len(self.prefix_group) != size:
            raise AstraiBatchError(
                f"prefix_group has {len(self.prefix_group)} entries for {size} rows"
            )
        first_seen: list[int] = []
        for position in self.order:
            group = self.prefix_group[position]
            if group not in first_seen:
                first_seen.append(group)
        if len(first_seen) != self.num_groups:
            raise AstraiBatchError(
                f"num_groups is {self.num_groups} but {len(first_seen)} distinct groups occur"
            )
        if first_seen and first_seen != list(range(first_seen[0], first_seen[0] + len(first_seen))):
            raise AstraiBatchError(
                f"group ids are not dense and increasing in execution order: {first_seen}"
            )


def adapter_order(adapter: str | None) -> tuple[bool, str]:
    """Where an adapter's rows come in a window's order: the base model's first, then by name
    (Ray's sharding numbers prefix groups the same way)."""
    return (adapter is not None, adapter or "")


def plan_window(
    token_ids: Sequence[Sequence[int]],
    *,
    page_size: int,
    group_offset: int = 0,
    enable_grouping: bool = True,
    adapters: Sequence[str | None] | None = None,
) -> WindowPlan:
    """Plan one window of tokenized prompts.

    With grouping on, rows run sorted by their token ids; equal prompts keep their input
    order (the sort is stable). With grouping off, rows run in input order, and prefix
    groups are still reported (numbered in that order) so outputs stay comparable.
    Pass `group_offset` = the previous windows' total `num_groups` to keep ids unique
    across windows. `adapters` (each row's LoRA adapter, None the base) come first in the
    sort key and in a prefix group's key: an adapter's rows run together and share pages only
    with each other, as the prefix cache keys pages by adapter too.
    """
    require_positive_int("page_size", page_size)
    if group_offset < 0:
        raise ConfigError(f"group_offset must be >= 0, got {group_offset}")
    prompts = [tuple(ids) for ids in token_ids]
    names = [None] * len(prompts) if adapters is None else list(adapters)
    if len(names) != len(prompts):
        raise ConfigError(f"{len(names)} adapters for {len(prompts)} prompts")
    if enable_grouping:
        keys = [(*adapter_order(name), prompt) for name, prompt in zip(names, prompts, strict=True)]
        order = tuple(sorted(range(len(prompts)), key=keys.__getitem__))
    else:
        order = tuple(range(len(prompts)))

    group_of_first_page: dict[tuple[str | None, tuple[int, ...]], int] = {}
    prefix_group = [0] * len(prompts)
    next_group = group_offset
    for position in order:
        prompt = prompts[position]
        if len(prompt) < page_size:
            prefix_group[position] = next_group
            next_group += 1
            continue
        first_page = (names[position], prompt[:page_size])
        group = group_of_first_page.get(first_page)
        if group is None:
            group = next_group
            group_of_first_page[first_page] = group
            next_group += 1
        prefix_group[position] = group
    return WindowPlan(
        order=order, prefix_group=tuple(prefix_group), num_groups=next_group - group_offset
    )
