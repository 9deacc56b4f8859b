"""Queries inside an image whose placeholders attend to each other (`StepArrays.key_limits`,
`engine/vision/image_spans.py`): each sees keys up to its image's last position, a sliding
window still counted from its own. The CPU flash kernel's plan, the block attention and the
step-shaped path against a float64 brute force, with images crossing key-block boundaries;
the two invariant ones bit for bit alone and in random crowds whose chunks end anywhere but
inside an image.

The pool, its queries and keys: `attention_kit`, shared with the other attention tests.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from attention_kit import (
    GROUP,
    KV_HEADS,
    LENGTHS,
    PAGE,
    SCALE,
    Pool,
    probed_gemm_rows,
    step_for,
)

from astrai_batch.engine.attention.block_attention import block_attention
from astrai_batch.engine.attention.flash_block_plan import plan_flash_step
from astrai_batch.engine.attention.flash_block_types import FlashBlockBatch, FlashRules
from astrai_batch.engine.attention.flash_blocks import flash_block_attention
from astrai_batch.engine.attention.host_staging import HostStaging
from astrai_batch.engine.attention.page_gather import PageGatherer
from astrai_batch.engine.attention.paged_attention import paged_attention
from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.runner.attention_batches import block_batch, step_shaped_batch
from astrai_batch.engine.vision.image_inputs import ImageInput
from astrai_batch.engine.vision.image_spans import key_limits

# sequence -> its images' [start, end): across a 64-key block (60-70), over several blocks
# (10-300), across the 512-key block (490-530), two adjacent images as one run (600-632)
IMAGES = {1: [(3, 20)], 2: [(60, 70)], 3: [(10, 300)], 7: [(490, 530), (600, 616), (616, 632)]}
CROWD = (1, 2, 3, 7)  # the sequences the crowd tests run


def images_of(seq: int) -> tuple:
    return tuple(ImageInput(bytes(32), a, b - a, torch.zeros(1)) for a, b in IMAGES.get(seq, ()))


def step_of(pool: Pool, chunks) -> tuple[StepArrays, torch.Tensor, torch.Tensor]:
    """(the step's arrays with each query's last key, its queries, its tokens' pool slots)."""

    def limits(positions):
        scheduled = [
            SimpleNamespace(start=s, token_ids=range(n), images=images_of(seq))
            for seq, s, n in chunks
        ]
        return key_limits(scheduled, positions)

    step, queries = step_for(pool, chunks, limits, with_slots=True)
    return step, queries, torch.from_numpy(step.write_slots)


def outputs(chunks, out) -> dict:
    got, row = {}, 0
    for seq, start, n in chunks:
        for p in range(start, start + n):
            got[(seq, p)] = out[row]
            row += 1
    return got


def run_flash(pool: Pool, chunks, window=None, block=64) -> dict:
    step, q, _ = step_of(pool, chunks)
    staging = HostStaging("cpu")
    rules = FlashRules(GROUP, (block,), block)  # a full block's key count only: no tail probe
    calls, merge = plan_flash_step(step, PAGE, rules, torch.float32, staging, window)
    batch = FlashBlockBatch(
        [pool.keys], [pool.values], PAGE, None, 0, calls, merge, PageGatherer(), window
    )
    return outputs(chunks, flash_block_attention(q, pool.keys, pool.values, batch, SCALE))


def _view(pool: Pool):
    return SimpleNamespace(key_cache=[pool.keys], value_cache=[pool.values], page_size=PAGE)


def run_block(pool: Pool, chunks, window=None) -> dict:
    step, q, _ = step_of(pool, chunks)
    batch = block_batch(
        step,
        _view(pool),
        HostStaging("cpu"),
        PageGatherer(),
        use_cascade=True,
        gemm_rows=probed_gemm_rows(),
        window=window,
    )
    return outputs(chunks, block_attention(q, pool.keys, pool.values, batch, SCALE))


def run_step_shaped(pool: Pool, chunks) -> dict:
    """Fast numerics' step-shaped SDPA, through `paged_attention` as a layer calls it (its new
    keys written back over themselves)."""
    step, q, slots = step_of(pool, chunks)
    batch = step_shaped_batch(
        step, _view(pool), HostStaging("cpu"), PageGatherer(), use_cascade=True
    )
    batch = dataclasses.replace(batch, write_slots=slots)
    key, value = pool.keys[slots], pool.values[slots]
    out, _ = paged_attention(
        SimpleNamespace(layer_idx=0),
        q.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        None,
        scaling=SCALE,
        astrai_attention_batch=batch,
    )
    return outputs(chunks, out[0])


def last_key(seq: int, p: int) -> int:
    """The last key position p sees: the end of its run of image positions, else p."""
    image = set()
    for a, b in IMAGES.get(seq, ()):
        image.update(range(a, b))
    if p not in image:
        return p
    while p + 1 in image:
        p += 1
    return p


def brute_force(pool: Pool, seq: int, start: int, n: int, window=None) -> torch.Tensor:
    """[n, Hq, D] positions [start, start + n)'s attention in float64: a softmax over each
    one's visible keys, as transformers' eager attention forms it."""
    positions = torch.arange(start, start + n)
    limits = torch.tensor([last_key(seq, p) for p in positions.tolist()])
    keys = torch.arange(int(limits.max()) + 1)
    hidden = keys[None, :] > limits[:, None]
    if window is not None:
        hidden |= keys[None, :] <= positions[:, None] - window
    slots = pool.slots(seq, range(len(keys)))
    q = pool.queries[seq][start : start + n].double().view(n, KV_HEADS, GROUP, -1)
    k = pool.keys[slots].double()  # [keys, Hkv, D]
    v = pool.values[slots].double()
    scores = torch.einsum("nhgd,khd->nhgk", q, k) * SCALE
    scores.masked_fill_(hidden[:, None, None, :], float("-inf"))
    out = torch.einsum("nhgk,khd->nhgd", torch.softmax(scores, dim=-1), v)
    return out.reshape(n, KV_HEADS * GROUP, -1)


# whole prompts, and chunks that start inside an image (after a cache hit) and end after it
CHUNKS = [(1, 0, 40), (2, 0, 100), (3, 290, 30), (7, 500, 140), (6, 699, 1)]


@pytest.mark.parametrize(
    ("path", "window"),
    [
        ("flash-64", None),
        ("flash-64", 40),
        ("flash-512", None),
        ("flash-512", 300),
        ("block", None),
        ("block", 300),
        ("step-shaped", None),  # fast numerics: the engine plans it for windowless models only
    ],
)
def test_outputs_match_a_float64_brute_force(path, window) -> None:
    pool = Pool(seed=3)
    if path.startswith("flash"):
        got = run_flash(pool, CHUNKS, window, block=int(path.split("-")[1]))
    elif path == "block":
        got = run_block(pool, CHUNKS, window)
    else:
        got = run_step_shaped(pool, CHUNKS)
    for seq, start, n in CHUNKS:
        rows = torch.stack([got[(seq, p)] for p in range(start, start + n)])
        want = brute_force(pool, seq, start, n, window)
        torch.testing.assert_close(rows.double(), want, atol=2e-6, rtol=1e-5)


def crowd_steps(rng: random.Random) -> list[list[tuple[int, int, int]]]:
    """Every position of every sequence in chunks that end anywhere but inside an image
    (the scheduler's rule), mixed into steps, at most one chunk per sequence a step."""
    pieces = []
    for seq in CROWD:
        n, start = LENGTHS[seq], 0
        while start < n:
            end = min(n, start + (1 if rng.random() < 0.3 else rng.randint(1, n - start)))
            end = max(end, last_key(seq, end - 1) + 1)  # never inside an image
            pieces.append((seq, start, end - start))
            start = end
    rng.shuffle(pieces)
    steps: list[list[tuple[int, int, int]]] = []
    for piece in pieces:
        home = [s for s in steps if all(c[0] != piece[0] for c in s) and rng.random() < 0.7]
        if not home:
            steps.append([])
            home = [steps[-1]]
        home[0].append(piece)
    return steps


@pytest.mark.parametrize(("path", "window"), [("flash", None), ("flash", 300), ("block", 40)])
def test_image_queries_have_the_same_bits_alone_and_in_crowds(path, window) -> None:
    run = run_block if path == "block" else run_flash
    pool = Pool(seed=4)
    alone = {}
    for seq in CROWD:
        alone.update(run(pool, [(seq, 0, LENGTHS[seq])], window))
    for step in crowd_steps(random.Random(5)):
        for key, row in run(pool, step, window).items():
            assert torch.equal(row, alone[key]), f"{key} differs in step {step}"


def test_a_chunk_ending_inside_an_image_is_refused() -> None:
    with pytest.raises(ValueError, match="a prefill chunk ends inside an image's placeholders"):
        step_of(Pool(seed=0), [(3, 0, 100)])
