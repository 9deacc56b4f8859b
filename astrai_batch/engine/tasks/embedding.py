"""Embedding requests: the pooled last hidden state of a prompt, no decode.

An embedding sequence carries `EmbedTargets`, prompt logits positions as prompt logprobs do
(`sampling.prompt_logprobs`), so the runner keeps those rows; the core reads their hidden
states off the input of the model's output layer (a forward pre-hook that copies only while
a step has such rows) and the sequence ends once its prompt is computed. Last-token pooling
wants only the last position, so everything before it may come from the prefix cache (rows
sharing an instruction prefix share its pages); the other poolings want every position (or
the first) and so compute the whole prompt.

Pooling follows sentence-transformers' `Pooling` over one unpadded sequence (float32: the kept
hidden states are float32 copies): `max` is the element-wise maximum, `weighted-mean` weighs
position i (from 1) by i, `mean-sqrt-len` divides the sum by sqrt(n). Then the request's
`head`, the model's Dense (`activation(x W^T + b)`) and Normalize modules in their order.

The pooled vector is a function of the sequence's own rows only (a mean sums the rows of
all chunks at once, in position order), so with invariant numerics it does not depend on
what ran beside it or on chunking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from astrai_batch.engine.sampling.prompt_logprobs import LogitRows, PositionTargets
from astrai_batch.engine.tasks.embedding_types import DenseStep, EmbedRequest


class EmbedTargets(PositionTargets):
    """Positions whose hidden states an embedding pools (they score no token)."""

    __slots__ = ("hidden", "request")

    def __init__(self, length: int, request: EmbedRequest) -> None:
        lo, hi = {"last": (length - 1, length), "cls": (0, 1)}.get(request.pooling, (0, length))
        super().__init__(lo, [()] * (hi - lo))
        self.request = request
        self.hidden: list[torch.Tensor | None] = [None] * (hi - lo)

    @property
    def complete(self) -> bool:
        return all(row is not None for row in self.hidden)

    def embedding(self) -> torch.Tensor:
        rows = torch.stack(self.hidden)  # type: ignore[arg-type]
        return finish_vector(run_head(pool(rows, self.request.pooling), self.request), self.request)


def pool(rows: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector from the pooled positions' hidden states ([n, hidden], in position order;
    for `last` and `cls` the one row)."""
    if pooling == "mean":
        return rows.mean(dim=0)
    if pooling == "max":
        return rows.amax(dim=0)
    if pooling == "mean-sqrt-len":
        return rows.sum(dim=0) / math.sqrt(rows.shape[0])
    if pooling == "weighted-mean":
        weights = torch.arange(1, rows.shape[0] + 1, dtype=rows.dtype, device=rows.device)
        return (rows * weights[:, None]).sum(dim=0) / weights.sum()
    return rows[0]


_ACTIVATIONS = {
    "identity": lambda x: x,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
}


def run_head(pooled: torch.Tensor, request: EmbedRequest) -> torch.Tensor:
    """The model's sentence-transformers Dense and Normalize modules, in their order."""
    vector = pooled
    for step in request.head:
        if isinstance(step, DenseStep):
            weight = step.weight.to(vector.device)
            bias = None if step.bias is None else step.bias.to(vector.device)
            vector = _ACTIVATIONS[step.activation](torch.nn.functional.linear(vector, weight, bias))
        else:
            vector = torch.nn.functional.normalize(vector, dim=0)
    return vector


def finish_vector(pooled: torch.Tensor, request: EmbedRequest) -> torch.Tensor:
    """Matryoshka truncation, then (optionally) unit L2 norm."""
    vector = pooled[: request.dimensions] if request.dimensions else pooled
    if request.normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector


def store_hidden(hidden: torch.Tensor, rows: LogitRows) -> None:
    """The hidden rows of embedding owners (`hidden`: the extra rows' hidden states)."""
    for row, (owner, position) in enumerate(zip(rows.owners, rows.positions, strict=True)):
        if isinstance(owner, EmbedTargets):
            owner.hidden[position - owner.lo] = hidden[row].float().clone()


class HiddenCapture:
    """A forward pre-hook on the output layer keeping its input (the final hidden states of
    the rows whose logits the step computes) while `armed`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.armed = False
        self.rows: torch.Tensor | None = None
        head = model.get_output_embeddings()
        self._handle = head.register_forward_pre_hook(self._keep)

    def _keep(self, _module: torch.nn.Module, args: Sequence[torch.Tensor]) -> None:
        if self.armed:
            self.rows = args[0].reshape(-1, args[0].shape[-1])

    def remove(self) -> None:
        self._handle.remove()

    def take(self) -> torch.Tensor:
        rows, self.rows = self.rows, None
        if rows is None:
            raise RuntimeError("the step kept no hidden rows for its embeddings")
        return rows
