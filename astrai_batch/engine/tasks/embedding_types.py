"""What an embedding request asks (no torch: jobs build it; a Dense step's tensors are typed
`Any` here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# sentence-transformers' pooling modes, by our names: the last token's state, the mean, the
# first token's, the element-wise max, the mean weighted by position (1, 2, ..., n), and the
# sum over the square root of the length
POOLINGS = ("last", "mean", "cls", "max", "weighted-mean", "mean-sqrt-len")

# the activations a Dense step may apply, by sentence-transformers' class names
ACTIVATIONS = ("identity", "tanh", "sigmoid", "relu", "gelu")


@dataclass(frozen=True, eq=False)
class DenseStep:
    """A sentence-transformers Dense module: `activation(x W^T + b)`, float32 tensors."""

    weight: Any  # torch.Tensor [out_features, in_features]
    bias: Any  # torch.Tensor [out_features], or None
    activation: str
    source: str  # the module's folder, for messages

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class NormalizeStep:
    """A sentence-transformers Normalize module: unit L2 norm."""


@dataclass(frozen=True)
class EmbedRequest:
    """Pool the model's last hidden state (after its final norm) over the prompt (`POOLINGS`);
    then run the model's sentence-transformers `head` (its Dense and Normalize modules, in
    order); then keep the first `dimensions` values (Matryoshka truncation) and, with
    `normalize`, scale to unit L2 norm (truncation first, as OpenAI's `dimensions` returns
    unit vectors). `max_prompt_tokens`: the model's sentence-transformers max_seq_length (a
    longer prompt is a row error: sentence-transformers would truncate it)."""

    pooling: str = "last"
    normalize: bool = True
    dimensions: int | None = None
    head: tuple[DenseStep | NormalizeStep, ...] = ()
    max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool)
            or not isinstance(self.dimensions, int)
            or self.dimensions < 1
        ):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
        for step in self.head:
            if isinstance(step, DenseStep) and step.activation not in ACTIVATIONS:
                raise ValueError(f"unknown Dense activation {step.activation!r}")

    def width(self, hidden_size: int) -> int:
        """The vector's size before truncation: the last Dense step's, else the hidden size."""
        for step in reversed(self.head):
            if isinstance(step, DenseStep):
                return step.out_features
        return hidden_size
