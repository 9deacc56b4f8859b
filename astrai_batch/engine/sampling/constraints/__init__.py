"""Structured outputs: constraints on what a row may generate (JSON schema, regex, choice,
EBNF grammar), compiled by a backend library and enforced as per-step token masks.

Only the torch-free `Constraint` is imported here, so configuration and input parsing can
build constraints without loading torch or the backend library; the engine imports the
backend, the grammar cache and the mask filler from their own modules.
"""

from astrai_batch.engine.sampling.constraints.spec import CONSTRAINT_KINDS, Constraint

__all__ = ["CONSTRAINT_KINDS", "Constraint"]
