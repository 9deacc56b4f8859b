"""The interface a constraint library implements for the engine (xgrammar today; another
library such as llguidance would be a second implementation of the same two classes).

Contract:
- `schema_support` says which JSON Schema keywords the backend enforces; `check` refuses a
  schema using any other (`schema_support.find_unenforced`), before `compile`, so a row
  never runs under a schema that is only partly enforced;
- `compile` turns a `Constraint` into an opaque compiled grammar, or raises
  `ConstraintCompileError` with a one-line message in the user's terms;
- a `Matcher` follows one sequence's output token by token; while it is not terminated it
  allows at least one token, and once the grammar is complete it allows the model's
  end-of-sequence tokens, whose acceptance terminates it;
- masks are packed bitmasks whose rows line up with the rows of the step's logits;
  `fill_masks` writes the rows of several matchers in one call, `apply_masks` sets every
  disallowed logit of those rows to -inf in place.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from astrai_batch.engine.sampling.constraints.schema_support import SchemaSupport, find_unenforced
from astrai_batch.engine.sampling.constraints.spec import Constraint
from astrai_batch.errors import AstraiBatchError


class ConstraintCompileError(AstraiBatchError):
    """A constraint the backend cannot compile or enforce; the row fails with this message."""


class Matcher(ABC):
    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advances over one token; False when the grammar does not allow it."""

    @property
    @abstractmethod
    def terminated(self) -> bool:
        """True once an end-of-sequence token was accepted after a complete output."""


class ConstraintBackend(ABC):
    name: str
    schema_support: SchemaSupport

    def check(self, constraint: Constraint) -> None:
        """Raises ConstraintCompileError when a json_schema uses a feature this backend does
        not enforce (a schema that is not valid JSON is left to `compile`)."""
        if constraint.kind != "json_schema":
            return
        try:
            schema = json.loads(constraint.text)
        except json.JSONDecodeError:
            return
        problem = find_unenforced(schema, self.schema_support)
        if problem is not None:
            raise ConstraintCompileError(problem.message)

    @abstractmethod
    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar; raises ConstraintCompileError."""

    @abstractmethod
    def matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of the output."""

    @abstractmethod
    def allocate_masks(self, rows: int) -> torch.Tensor:
        """A packed mask buffer for `rows` sequences (CPU)."""

    @abstractmethod
    def fill_masks(self, matchers: Sequence[Matcher], masks: torch.Tensor, rows: list[int]) -> None:
        """Writes matcher i's allowed tokens into row `rows[i]` of `masks`, in one call."""

    @abstractmethod
    def accept_tokens(self, matchers: Sequence[Matcher], token_ids: Sequence[int]) -> list[bool]:
        """Advances each matcher over its token, all in one call."""

    @abstractmethod
    def apply_masks(self, scores: torch.Tensor, masks: torch.Tensor, rows: list[int]) -> None:
        """Each row r in `rows` of `scores` keeps only the tokens row r of `masks` allows."""
