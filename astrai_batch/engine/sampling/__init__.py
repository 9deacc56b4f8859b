"""Choosing tokens: sampling parameters, per-sequence sampler state, stop strings, constraints.

`params` is light (no torch) so jobs can validate rows without loading the engine;
`token_sampling` turns a step's logits into tokens; `constraints/` holds structured outputs
(grammars, JSON schema support). Imports nothing of the runner or attention.
"""
