"""Compiled grammars by constraint digest: a million rows sharing one schema compile once.

Failures are remembered too, so a bad schema repeated on many rows is reported on each of them
but compiled only once. The cache holds at most `capacity` entries and drops the least
recently used one beyond that; sequences keep their own reference to what they use, so a
dropped grammar stays alive while any row still decodes with it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from astrai_batch.engine.sampling.constraints.backend import (
    ConstraintBackend,
    ConstraintCompileError,
)
from astrai_batch.engine.sampling.constraints.spec import Constraint

DEFAULT_CAPACITY = 256


class GrammarCache:
    def __init__(self, backend: ConstraintBackend, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.backend = backend
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self.compiled = 0  # compile calls, successful or not
        self.compile_seconds = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, constraint: Constraint) -> Any:
        """The compiled grammar; raises ConstraintCompileError (also when cached as failed)."""
        key = constraint.digest
        entry = self._entries.get(key)
        if entry is None:
            started = time.perf_counter()
            try:
                self.backend.check(constraint)
                entry = self.backend.compile(constraint)
            except ConstraintCompileError as exc:
                entry = exc
            self.compile_seconds += time.perf_counter() - started
            self.compiled += 1
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        if isinstance(entry, ConstraintCompileError):
            raise ConstraintCompileError(str(entry))
        return entry
