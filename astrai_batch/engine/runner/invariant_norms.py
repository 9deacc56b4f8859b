"""Normalization layers whose per-row result never depends on the step's row count (CUDA).

A norm reduces along its row, and torch's CUDA reductions split a row's sum by the tensor's
shape. Under invariant numerics on CUDA every norm of the model therefore runs one of two
ways, swapped in by replacing the instance's `forward` (parameters and names untouched):

- the RMSNorm of the Llama family (`weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`, the
  classes in `LLAMA_RMSNORMS`) takes its mean from `norm_triton` (one program per row) and
  computes the rest with the same elementwise torch operations as transformers;
- any other norm (LayerNorm, Gemma's `1 + weight`, ...) runs its own forward on row tiles of
  exactly `TILE_ROWS` rows, the last zero-padded: one shape, so one reduction split. It costs
  a few kernel launches per tile; the start-up probe still judges the result.

The CPU needs neither: its reductions sum a row in one thread, whatever the row count (the
start-up probe checks that too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

TILE_ROWS = 256
# classes whose forward is LlamaRMSNorm's, line for line (test_invariant_norms checks)
LLAMA_RMSNORMS = frozenset(
    {
        "LlamaRMSNorm",
        "MistralRMSNorm",
        "MixtralRMSNorm",
        "Qwen2RMSNorm",
        "Qwen2MoeRMSNorm",
        "Qwen3RMSNorm",
        "Qwen3MoeRMSNorm",
        "Phi3RMSNorm",
        "GraniteRMSNorm",
        "GraniteMoeRMSNorm",
        "SmolLM3RMSNorm",
        "ArceeRMSNorm",
        "SeedOssRMSNorm",
        "HunYuanDenseV1RMSNorm",
        "Ernie4_5RMSNorm",
        "ApertusRMSNorm",
        "GlmRMSNorm",
        "OlmoeRMSNorm",
    }
)


def is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, nn.LayerNorm) or name.endswith(("RMSNorm", "LayerNorm"))


class TiledForward:
    """A norm's forward on fixed-shape row tiles; the instance attribute that replaces it."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], rows: int) -> None:
        self.forward = forward
        self.rows = rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        flat = x.reshape(-1, width)
        n, tile = flat.shape[0], self.rows
        out: torch.Tensor | None = None
        for start in range(0, max(n, 1), tile):
            part = flat[start : start + tile]
            staged = part.new_zeros(tile, width)
            staged[: part.shape[0]] = part
            y = self.forward(staged)[: part.shape[0]]
            if out is None:
                out = y.new_empty(n, *y.shape[1:])
            out[start : start + part.shape[0]] = y
        return out.view(*x.shape[:-1], out.shape[-1])


class RowMeanForward:
    """The Llama-family RMSNorm with its mean from `norm_triton`."""

    def __init__(self, norm: nn.Module, mean_squares: Callable[[torch.Tensor], torch.Tensor]):
        self.norm = norm
        self.mean_squares = mean_squares

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = self.mean_squares(hidden_states)
        hidden_states = hidden_states * torch.rsqrt(variance + norm.variance_epsilon)
        return norm.weight * hidden_states.to(input_dtype)


def set_norm_tiling(
    model: nn.Module,
    tiled: bool,
    mean_squares: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rows: int = TILE_ROWS,
) -> int:
    """Makes every norm of `model` invariant (or restores them all); returns how many changed.
    `mean_squares`: the Triton row mean (`norm_triton.mean_squares`); None: tiles only."""
    changed = 0
    for module in model.modules():
        replaced = isinstance(module.__dict__.get("forward"), TiledForward | RowMeanForward)
        if not tiled:
            if replaced:
                del module.forward
                changed += 1
            continue
        if replaced or not is_norm(module):
            continue
        if mean_squares is not None and type(module).__name__ in LLAMA_RMSNORMS:
            module.forward = RowMeanForward(module, mean_squares)
        else:
            module.forward = TiledForward(module.forward, rows)
        changed += 1
    return changed
