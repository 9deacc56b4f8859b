"""The row-parallel linear layer (a column-parallel one is a plain, smaller `nn.Linear`).

A rank holds the columns of the weight that meet its slice of the input features, computes
its partial product, and the ranks sum the partials (`RankGroup.sum_partials`); the bias,
whole on every rank, is added once after the sum. The partial product is an ordinary
`nn.Linear` child without bias, so invariant numerics tile it like any other projection
(`set_row_tiling` swaps it): each rank's row result is then independent of the step's other
rows, and the sum in rank order keeps it so. A LoRA adapter wraps the partial product
(`sharded_adapters`), so its partial delta is summed with the base's.
"""

from __future__ import annotations

import torch
from torch import nn

from astrai_batch.engine.parallel.rank_group import RankGroup

PARTIAL = "partial"  # the child holding the rank's partial product (a LoRA adapter wraps it)


class RowParallelLinear(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, *, bias: bool, group: RankGroup, device, dtype
    ) -> None:
        super().__init__()
        if in_features % group.world_size:
            raise ValueError(
                f"{in_features} input features do not split over {group.world_size} ranks"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.partial = nn.Linear(
            in_features // group.world_size, out_features, bias=False, device=device, dtype=dtype
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        )
        self._group = group

    @property
    def weight(self) -> torch.Tensor:
        partial = self.partial
        return getattr(partial, "base", partial).weight  # under a LoRA wrapper: its layer's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._group.sum_partials(self.partial(x))
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features} (this rank {self.in_features // self._group.world_size}), "
            f"out={self.out_features}, bias={self.bias is not None}"
        )
