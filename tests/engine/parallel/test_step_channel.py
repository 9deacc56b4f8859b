"""The step channel and the rank group's sums between two ranks in one process (two threads,
gloo over loopback): what rank 0 sends is what rank 1 receives (a job's adapters, an engine's
settings, steps with and without their chunks' adapter slots), small steps in one broadcast,
large ones (past the inline part) in two; partial sums are added in rank order (a LoRA
adapter's partial delta inside its rank's partial)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from rank_kit import on_both_ranks, rank_pair

from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.parallel.step_channel import (
    ADAPTERS,
    ENGINE,
    INLINE,
    STEP,
    STOP,
    StepChannel,
)


def _step(rng: np.random.Generator, chunks: int, pages: int) -> StepArrays:
    counts = rng.integers(1, 5, chunks)
    tokens = int(counts.sum())

    def ints(n):
        return rng.integers(0, 1 << 40, n)

    return StepArrays(
        token_ids=ints(tokens),
        positions=ints(tokens),
        write_slots=ints(tokens),
        logit_rows=ints(chunks // 2),
        token_start=ints(chunks),
        num_tokens=counts,
        context_start=ints(chunks),
        page_tables=rng.integers(0, 1000, (chunks, pages)),
        decodes=ints(chunks // 3),
        longest_context=int(rng.integers(1, 10_000)),
    )


@pytest.fixture(scope="module")
def groups():
    return rank_pair()


def test_what_rank_zero_sends_rank_one_receives(groups):
    zero, one = groups
    rng = np.random.default_rng(7)
    # small steps, then one past the inline part (a second broadcast), then small again
    sent = [_step(rng, 5, 3), _step(rng, 40, 300), _step(rng, 2, 1), _step(rng, 3, 2)]
    # each chunk's LoRA adapter slot travels with the step when the model has adapters
    slots = [None, rng.integers(0, 4, 40), rng.integers(0, 4, 2), None]
    assert sum(np.asarray(a).size for a in sent[1]) > INLINE
    settings = {"numerics": "invariant", "pages": 17}
    adapters = ([("a", "s3://bucket/a", "f00d"), ("b", "/adapters/b", "beef")], 16)
    got: list = []

    def receive():
        channel = StepChannel(one)
        while True:
            command, value = channel.receive()
            if command == STOP:
                return
            if command == STEP:  # views of the buffer: copied before the next receive
                arrays, chunk_slots = value
                value = (
                    [np.array(a) for a in arrays],
                    None if chunk_slots is None else np.array(chunk_slots),
                )
            got.append((command, value))

    worker = threading.Thread(target=receive)
    worker.start()
    channel = StepChannel(zero)
    channel.send_adapters(*adapters)
    channel.send_engine(settings)
    for step, chunk_slots in zip(sent, slots, strict=True):
        channel.send_step(step, chunk_slots)
    channel.send_stop()
    worker.join(timeout=60)
    assert got[0] == (ADAPTERS, adapters)
    assert got[1] == (ENGINE, settings)
    assert [command for command, _ in got[2:]] == [STEP] * len(sent)
    for step, chunk_slots, (_, (arrays, received)) in zip(sent, slots, got[2:], strict=True):
        for field, mine, theirs in zip(StepArrays._fields, step, arrays, strict=True):
            assert np.array_equal(np.asarray(mine), theirs), field
        if chunk_slots is None:
            assert received is None
        else:
            assert np.array_equal(received, chunk_slots)


def test_partials_are_summed_in_rank_order(groups):
    zero, one = groups
    rng = torch.Generator().manual_seed(3)
    parts = [torch.randn(7, 64, generator=rng) for _ in range(2)]
    out: dict[int, torch.Tensor] = {}

    def run(group):
        out[group.rank] = group.sum_partials(parts[group.rank].clone())

    worker = threading.Thread(target=run, args=(one,))
    worker.start()
    run(zero)
    worker.join(timeout=60)
    assert torch.equal(out[0], parts[0] + parts[1])
    assert torch.equal(out[1], out[0])


@pytest.mark.parametrize("vocab", [37, 64])
def test_the_vocabulary_parallel_head_gathers_each_ranks_rows_in_order(groups, vocab):
    """An uneven vocabulary (37 = 19 + 18 rows) pads the last rank's slice for the gather and
    drops the padding: the logits are each rank's own slice GEMM, column for column."""
    from astrai_batch.engine.parallel.vocab_head import CHILD, VocabParallelHead, vocab_rows

    zero, one = groups
    rng = torch.Generator().manual_seed(4)
    full = torch.nn.Linear(24, vocab, bias=True)
    x = torch.randn(3, 5, 24, generator=rng)
    heads = {}
    for group in (zero, one):
        head = VocabParallelHead(24, vocab, bias=True, group=group, device="cpu", dtype=None)
        first, last = vocab_rows(vocab, 2, group.rank)
        rows = getattr(head, CHILD)
        with torch.no_grad():
            rows.weight.copy_(full.weight[first:last])
            rows.bias.copy_(full.bias[first:last])
        heads[group.rank] = head
    out: dict[int, torch.Tensor] = {}

    def run(rank):
        with torch.inference_mode():
            out[rank] = heads[rank](x)

    worker = threading.Thread(target=run, args=(1,))
    worker.start()
    run(0)
    worker.join(timeout=60)
    expected = torch.cat([getattr(heads[r], CHILD)(x) for r in (0, 1)], dim=-1).detach()
    assert out[0].shape == (3, 5, vocab)
    assert torch.equal(out[0], expected) and torch.equal(out[1], expected)
    torch.testing.assert_close(out[0], full(x).detach())
    assert vocab_rows(vocab, 2, 0) == (0, -(-vocab // 2))


def test_a_lora_row_parallel_layer_adds_its_partial_delta_before_the_sum(groups):
    """The adapter wraps each rank's partial product: a rank's partial is its base partial plus
    its partial delta (A's columns, B whole), and the ranks' partials are added in rank order,
    bitwise; the result is the whole layer's with the whole adapter, within float rounding."""
    from astrai_batch.engine.lora.bank import LoraBank
    from astrai_batch.engine.lora.lora_linear import LoraLinear, LoraPair
    from astrai_batch.engine.parallel.sharded_linear import RowParallelLinear

    rng = torch.Generator().manual_seed(5)
    full = torch.nn.Linear(32, 24, bias=False)
    a, b = torch.randn(4, 32, generator=rng), torch.randn(24, 4, generator=rng)
    x = torch.randn(1, 6, 32, generator=rng)
    bank = LoraBank([])
    whole = LoraLinear(full, bank, [None, LoraPair(a, b, 0.5)])
    ranks = {}
    for group in groups:
        layer = RowParallelLinear(32, 24, bias=False, group=group, device="cpu", dtype=None)
        cols = slice(16 * group.rank, 16 * (group.rank + 1))
        with torch.no_grad():
            layer.partial.weight.copy_(full.weight[:, cols])
        layer.partial = LoraLinear(layer.partial, bank, [None, LoraPair(a[:, cols], b, 0.5)])
        ranks[group.rank] = layer
    bank.begin_step([1, 0], [4, 2], invariant=True, device=torch.device("cpu"))  # 4 LoRA rows
    with torch.inference_mode():
        # a rank's input is its slice of the features (its heads' attention output)
        out = on_both_ranks(lambda rank: ranks[rank](x[..., 16 * rank : 16 * (rank + 1)]))
        partials = [ranks[r].partial(x[..., 16 * r : 16 * (r + 1)]) for r in (0, 1)]
        expected = whole(x)
    bank.end_step()
    assert torch.equal(out[0], partials[0] + partials[1]) and torch.equal(out[1], out[0])
    torch.testing.assert_close(out[0], expected)
    assert not torch.allclose(out[0][0, :4], full(x)[0, :4])  # the adapter rows changed
    assert torch.equal(ranks[0].weight, full.weight[:, :16])
