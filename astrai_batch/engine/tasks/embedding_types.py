"""What an embedding request asks (no torch: jobs build it)."""

from __future__ import annotations

from dataclasses import dataclass

POOLINGS = ("last", "mean", "cls")


@dataclass(frozen=True)
class EmbedRequest:
    """Pool the model's last hidden state (after its final norm) over the prompt: the last
    token's, the mean of all tokens', or the first token's; then keep the first
    `dimensions` values (Matryoshka truncation) and, with `normalize`, scale to unit L2
    norm (truncation first, as OpenAI's `dimensions` returns unit vectors)."""

    pooling: str = "last"
    normalize: bool = True
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool)
            or not isinstance(self.dimensions, int)
            or self.dimensions < 1
        ):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
