"""Qwen-VL's multimodal rotary positions (M-RoPE), in closed form for any span of a sequence.

Each token has three positions (temporal, height, width). A text token's three are equal:
its index plus the shift the images before it add. An image of `height x width` merged
patches (one frame) placed when the running position is `p` gives its patch at row `r`,
column `c` the positions `(p, p + r, p + c)`, and moves the running position on by
`max(height, width)` where the image took `height * width` tokens. So a token's positions
depend only on its index and the images before it: a chunk's slice, or a decode token's
(index + the shift of all the images), is computed with no state kept per sequence. It is
transformers' `get_rope_index` (and, for decode, its `rope_deltas`) written per span
(tests/engine/vision/test_qwen_vl_exact.py compares the two).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mrope_positions(
    images: Sequence[tuple[int, int, int, int]], start: int, count: int
) -> np.ndarray:
    """[3, count] int64: the positions of tokens [start, start + count) of a sequence whose
    images are `(offset, frames, height, width)` each (in merged patches, by offset)."""
    index = np.arange(start, start + count, dtype=np.int64)
    out = np.tile(index, (3, 1))
    shift = 0  # what the images so far added to the running position
    for offset, frames, height, width in images:
        length = frames * height * width
        first = offset + shift  # the running position where the image begins
        lo, hi = max(start, offset), min(start + count, offset + length)
        if lo < hi:
            j = np.arange(lo - offset, hi - offset, dtype=np.int64)
            cols = slice(lo - start, hi - start)
            out[0, cols] = first + j // (height * width)
            out[1, cols] = first + (j // width) % height
            out[2, cols] = first + j % width
        added = max(height, width) - length
        shift += added
        out[:, max(0, offset + length - start) :] += added
    return out
