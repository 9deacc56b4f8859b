"""The shapes decode-only steps are padded to, so a few captured graphs serve every step.

A captured graph has one batch size and one context width. A step of n decoding sequences
whose longest context spans k key blocks runs in the smallest bucket (B >= n, W >= k); the
B - n padding rows are dropped afterwards, and keys past a row's context are masked. Batch
sizes: 1, 2, 4, 8, 16, 24, 32, then steps of 16 up to `max_num_seqs` (a padded row costs
little beside a step's weights, but a graph per size would cost capture time and memory).
Widths, in key blocks of `block_tokens` positions: powers of two up to the longest context,
so a step of short contexts never attends over `max_model_len`.

Graphs are captured when the engine is built, never mid-job (`capture_order`): at most
`MAX_CAPTURED` buckets, the smallest by padded size (batch x width) when there are more
(small steps are launch-bound, where a graph pays; a large step's kernels hide their
launches, and it runs eagerly at its bucket's shape), captured largest first as vLLM does, so
the smaller graphs reuse the largest one's memory pool.
"""

from __future__ import annotations

from dataclasses import dataclass

SMALL_BATCHES = (1, 2, 4, 8, 16, 24, 32)
BATCH_STEP = 16
MAX_CAPTURED = 64


@dataclass(frozen=True)
class GraphBuckets:
    batch_sizes: tuple[int, ...]  # ascending, the last is max_num_seqs
    widths: tuple[int, ...]  # key blocks, ascending, the last covers max_context

    @classmethod
    def for_limits(cls, max_num_seqs: int, max_context: int, block_tokens: int) -> GraphBuckets:
        if max_num_seqs < 1 or max_context < 1 or block_tokens < 1:
            raise ValueError(
                f"bucket limits must be positive, got max_num_seqs={max_num_seqs}, "
                f"max_context={max_context}, block_tokens={block_tokens}"
            )
        sizes = [b for b in SMALL_BATCHES if b < max_num_seqs]
        size = SMALL_BATCHES[-1] + BATCH_STEP
        while size < max_num_seqs:
            sizes.append(size)
            size += BATCH_STEP
        sizes.append(max_num_seqs)
        most_blocks = -(-max_context // block_tokens)
        widths = []
        width = 1
        while width < most_blocks:
            widths.append(width)
            width *= 2
        widths.append(most_blocks)
        return cls(tuple(sizes), tuple(widths))

    def select(self, num_rows: int, num_blocks: int) -> tuple[int, int] | None:
        """The smallest (batch size, width) holding the step; None when none does."""
        size = next((b for b in self.batch_sizes if b >= num_rows), None)
        width = next((w for w in self.widths if w >= num_blocks), None)
        if size is None or width is None or num_rows < 1 or num_blocks < 1:
            return None
        return size, width

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_width(self) -> int:
        return self.widths[-1]

    def capture_order(self, cap: int = MAX_CAPTURED) -> list[tuple[int, int]]:
        """The (batch size, width) buckets to capture up front, in capture order: the `cap`
        smallest by batch x width (ties: the smaller batch), largest first."""
        if cap < 1:
            raise ValueError(f"cap must be positive, got {cap}")
        every = [(b, w) for b in self.batch_sizes for w in self.widths]
        kept = sorted(every, key=lambda bw: (bw[0] * bw[1], bw[0]))[:cap]
        return sorted(kept, key=lambda bw: (bw[0] * bw[1], bw[0]), reverse=True)
