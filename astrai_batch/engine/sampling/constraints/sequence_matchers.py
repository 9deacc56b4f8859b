"""The engine's constrained sequences: one matcher per sequence, masks per step, statistics.

Owner of the map sequence -> matcher. Each of a request's `n` samples gets its own matcher
over the request's compiled grammar. A matcher has accepted exactly the sequence's generated
tokens (checked by `check_invariants`): it advances only when the engine appends a sampled
token, and a preempted sequence keeps its output and its matcher, so its recompute prefills
the same tokens and the next mask is the one an uninterrupted run would have used.

The backend is built on the first constrained request, so a job without constraints never
loads the library and its steps pay one empty-list check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from astrai_batch.engine.sampling.constraints.backend import ConstraintBackend, Matcher
from astrai_batch.engine.sampling.constraints.grammar_cache import GrammarCache
from astrai_batch.engine.sampling.constraints.mask_filler import MaskFiller, StepMasks
from astrai_batch.engine.sampling.constraints.spec import Constraint


class SequenceMatchers:
    def __init__(self, make_backend: Callable[[], ConstraintBackend]) -> None:
        self._make_backend = make_backend
        self._cache: GrammarCache | None = None
        self._filler: MaskFiller | None = None
        self._matchers: dict[int, Matcher] = {}
        self._accepted: dict[int, int] = {}
        self._filling = False
        self.constrained_requests = 0

    # -- requests --------------------------------------------------------------------------

    def compile(self, constraint: Constraint) -> Any:
        """The request's compiled grammar (cached by digest); raises ConstraintCompileError."""
        if self._cache is None:
            backend = self._make_backend()
            self._cache = GrammarCache(backend)
            self._filler = MaskFiller(backend)
        self.constrained_requests += 1  # also when it fails: the row is constrained all the same
        return self._cache.get(constraint)

    def attach(self, seq_id: int, compiled: Any) -> None:
        if self._cache is None:
            raise RuntimeError("attach() before any compile()")
        if seq_id in self._matchers:
            raise RuntimeError(f"sequence {seq_id} already has a matcher")
        self._matchers[seq_id] = self._cache.backend.matcher(compiled)
        self._accepted[seq_id] = 0

    def release(self, seq_id: int) -> None:
        self._matchers.pop(seq_id, None)
        self._accepted.pop(seq_id, None)

    @property
    def active(self) -> bool:
        """True while some sequence is constrained (otherwise a step has nothing to do here)."""
        return bool(self._matchers)

    def terminated(self, seq_id: int) -> bool:
        matcher = self._matchers.get(seq_id)
        return matcher is not None and matcher.terminated

    # -- one step --------------------------------------------------------------------------

    def start_step(self, sampling_seq_ids: Sequence[int]) -> None:
        """Starts filling the masks of the constrained ones among the step's sampling rows
        (row i of the logits belongs to sampling_seq_ids[i])."""
        if not self._matchers:
            return
        rows = [row for row, seq_id in enumerate(sampling_seq_ids) if seq_id in self._matchers]
        if not rows:
            return
        assert self._filler is not None
        matchers = [self._matchers[sampling_seq_ids[row]] for row in rows]
        self._filler.start(matchers, rows, len(sampling_seq_ids))
        self._filling = True

    def finish_step(self) -> StepMasks | None:
        """The masks started by `start_step`, or None when the step has no constrained row."""
        if not self._filling:
            return None
        self._filling = False
        assert self._filler is not None
        return self._filler.wait()

    def accept(self, seq_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """Advances the matchers of the constrained sequences over their sampled tokens."""
        if not self._matchers:
            return
        pairs = [(s, t) for s, t in zip(seq_ids, token_ids, strict=True) if s in self._matchers]
        if not pairs:
            return
        assert self._cache is not None
        matchers = [self._matchers[seq_id] for seq_id, _ in pairs]
        accepted = self._cache.backend.accept_tokens(matchers, [token for _, token in pairs])
        for (seq_id, token), ok in zip(pairs, accepted, strict=True):
            if not ok:
                raise RuntimeError(
                    f"sequence {seq_id} sampled token {token}, which its grammar forbids; "
                    "the mask was not applied (this is a bug)"
                )
            self._accepted[seq_id] += 1

    # -- statistics ------------------------------------------------------------------------

    @property
    def grammars_compiled(self) -> int:
        return 0 if self._cache is None else self._cache.compiled

    @property
    def compile_seconds(self) -> float:
        return 0.0 if self._cache is None else self._cache.compile_seconds

    @property
    def fill_seconds(self) -> float:
        return 0.0 if self._filler is None else self._filler.fill_seconds

    @property
    def wait_seconds(self) -> float:
        return 0.0 if self._filler is None else self._filler.wait_seconds

    def close(self) -> None:
        if self._filler is not None:
            self._filler.close()

    def check_invariants(self, generated: Callable[[int], int]) -> None:
        """Every matcher has accepted exactly its sequence's generated tokens."""
        if self._filling:
            raise RuntimeError("a mask fill is in flight between steps")
        for seq_id, count in self._accepted.items():
            if count != generated(seq_id):
                raise RuntimeError(
                    f"sequence {seq_id}: matcher accepted {count} tokens, "
                    f"sequence generated {generated(seq_id)}"
                )
