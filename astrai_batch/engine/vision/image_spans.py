"""Images whose placeholder tokens attend to each other in both directions (Gemma 3).

transformers gives such a model, at prefill, a mask that lets every query inside an image's
run of placeholders see the whole run (`token_type_ids` -> block ids: consecutive image
positions form one block, so two images with no text between them are one block), keys
after it still hidden; its decode steps are causal. The engine keeps that with one number per
query: the last key position it sees (`key_limits`), its own position for every text token
and the run's last position inside a run. A sliding window still counts back from the
query's own position (transformers: window AND (causal OR same block)).

The keys a run's queries read must exist when they run, so for such a model a prefill chunk
never ends strictly inside a run (`fit_chunk`): a chunk that would is cut at the run's start,
or, when it starts inside or at the run, waits for a step with room for the rest of it (a
run longer than the step's token budget is refused at arrival, `image_run_problem`). Every KV entry
written at a run position was therefore computed seeing the whole run, which is why a prefix
cache hit may end inside a run: the cached entries are the ones this row would compute (the
pages' token ids carry the image's content ids, so the image is the same), and the chunk
that follows computes the run's remaining queries with all its keys in the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def image_runs(images: Sequence[Any]) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive placeholder positions (adjacent images merged),
    in prompt order. `images`: `ImageInput`s, sorted by offset, never overlapping."""
    runs: list[tuple[int, int]] = []
    for image in images:
        if runs and runs[-1][1] == image.offset:
            runs[-1] = (runs[-1][0], image.end)
        else:
            runs.append((image.offset, image.end))
    return runs


def image_run_problem(images: Sequence[Any], max_batched_tokens: int) -> str | None:
    """Why a request's images can never be prefilled whole (a row error), or None."""
    longest = max((end - start for start, end in image_runs(images)), default=0)
    if longest <= max_batched_tokens:
        return None
    return (
        f"an image takes {longest} placeholder tokens, computed in one step with this model, "
        f"more than the step's token budget ({max_batched_tokens}, --max-num-batched-tokens)"
    )


def fit_chunk(images: Sequence[Any], start: int, num: int) -> int:
    """The most tokens, at most `num`, a chunk starting at `start` may take so that it does
    not end strictly inside a run (0: none; the chunk waits for a step with more room)."""
    end = start + num
    for first, stop in image_runs(images):
        if first < end < stop:
            end = first
            break
    return max(end - start, 0)


def key_limits(chunks: Sequence[Any], positions: np.ndarray) -> np.ndarray | None:
    """[T] the last key position each of the packed step's queries sees (`positions`, the
    step's, where no run is), or None when no chunk of the step covers a run."""
    limits = None
    row = 0
    for chunk in chunks:
        start, count = chunk.start, len(chunk.token_ids)
        end = start + count
        # a one-token chunk (a decode; in an image only its last position, `fit_chunk`)
        # sees up to itself: a decode step costs no pass over its images
        for first, stop in image_runs(chunk.images) if chunk.images and count > 1 else ():
            lo, hi = max(first, start), min(stop, end)
            if lo >= hi:
                continue
            if hi < stop:
                raise ValueError("a prefill chunk ends inside an image's placeholders")
            if limits is None:
                limits = positions.copy()
            limits[row + lo - start : row + hi - start] = stop - 1
        row += count
    return limits
