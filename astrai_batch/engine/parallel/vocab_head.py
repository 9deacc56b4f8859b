"""The LM head split over the vocabulary, as transformers' plans say (`colwise_gather_output`).

Rank r holds the weight rows of vocabulary entries [r * share, min(V, (r + 1) * share)),
share = ceil(V / N), and computes those logits in full: every logit is one rank's whole dot
product, never a sum over ranks, so the gathered logits are the bits one rank's slice GEMM
gives. The slices are padded to `share` columns for the all-gather and the padding dropped
after it. The slice is an ordinary `nn.Linear` child, so invariant numerics tile it like any
projection. For a head tied to the input embedding (SmolLM2) the slice is a view of the
embedding's rows: the rank holds the embedding once.
"""

from __future__ import annotations

import torch
from torch import nn

from astrai_batch.engine.parallel.rank_group import RankGroup

CHILD = "vocab_rows"  # `VocabParallelHead.vocab_rows`: the loader reads it as the head


def _share(vocab: int, world_size: int) -> int:
    return -(-vocab // world_size)


def vocab_rows(vocab: int, world_size: int, rank: int) -> tuple[int, int]:
    """[first, last) of the vocabulary rank `rank` computes."""
    share = _share(vocab, world_size)
    first = min(vocab, rank * share)
    return first, min(vocab, first + share)


class VocabParallelHead(nn.Module):
    def __init__(
        self, in_features: int, vocab: int, *, bias: bool, group: RankGroup, device, dtype
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = vocab
        self.share = _share(vocab, group.world_size)
        self.first, self.last = vocab_rows(vocab, group.world_size, group.rank)
        rows = self.last - self.first
        self.vocab_rows = nn.Linear(in_features, rows, bias=bias, device=device, dtype=dtype)
        self._group = group

    @property
    def weight(self) -> torch.Tensor:
        return self.vocab_rows.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.vocab_rows(x)
        short = self.share - part.shape[-1]
        if short:
            part = torch.cat([part, part.new_zeros(*part.shape[:-1], short)], dim=-1)
        logits = torch.cat(self._group.gather(part), dim=-1)
        return logits[..., : self.out_features]

    def extra_repr(self) -> str:
        rows = f"this rank {self.first}-{self.last}"
        return f"in={self.in_features}, vocab={self.out_features} ({rows})"
