"""What the engine decides about a request when it arrives, before any step: whether it can
ever run, and the seed of each unseeded sample."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence


def why_never_fits(
    prompt: tuple[int, ...],
    max_tokens: int,
    *,
    vocab_size: int,
    max_model_len: int,
    page_size: int,
    usable_pages: int,
    logit_bias: Sequence[tuple[int, float]] = (),
) -> str | None:
    """The row error of a request no step could ever run, or None when it fits."""
    if not prompt:
        return "prompt is empty"
    bad = next((t for t in prompt if t < 0 or t >= vocab_size), None)
    if bad is not None:
        return f"prompt token id {bad} is outside the vocabulary (size {vocab_size})"
    bad = next((t for t, _ in logit_bias if t >= vocab_size), None)
    if bad is not None:
        return f"logit_bias token id {bad} is outside the vocabulary (size {vocab_size})"
    total = len(prompt) + max_tokens
    if total > max_model_len:
        return (
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
            f"the model context of {max_model_len} tokens"
        )
    pages = -(-total // page_size)
    if pages > usable_pages:
        return (
            f"prompt + max_tokens needs {pages} KV pages but the cache holds only "
            f"{usable_pages}; raise --kv-cache-memory or lower max_tokens"
        )
    return None


def fallback_seed(engine_seed: int, seed_key: Hashable, sample_index: int) -> int:
    """A per-sample seed for unseeded sampling that depends on neither arrival order nor
    batch: only the engine seed, the request's seed key and the sample index."""
    digest = hashlib.sha256(f"{engine_seed}:{seed_key!r}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def unknown_adapter_message(name: str, known: Sequence[str]) -> str:
    """The row error of a request naming an adapter the job did not load."""
    if not known:
        return f"unknown LoRA adapter {name!r}: the job has no adapters (--lora NAME=PATH)"
    return f"unknown LoRA adapter {name!r}; this job's adapters: {', '.join(known)}"
