"""What a model's attention does to scores besides causal softmax: sliding windows, learned
sinks, logit softcapping. Read from the config once; every path applies them itself.

- sliding window W (transformers' `sliding_window_overlay`): a query at position p sees keys
  at positions > p - W, so W keys counting itself. Layers say per call whether theirs binds
  (`sliding_window` is None on a full-attention layer of `layer_types`), so the attention
  chooses the step's plan per layer (`WindowPlans`);
- sinks (gpt-oss's `s_aux`, one logit per query head): an extra column of the softmax whose
  value is dropped, so the output is sum_k p_k v_k / (sum_k p_k + exp(sink - max)), max
  taken over the scores and the sink;
- softcap C (Gemma 2's `attn_logit_softcapping`): scores become C * tanh(scores / C) before
  the mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ScoreFeatures:
    window: int | None  # the config's sliding window, where a layer may apply one
    softcap: float | None
    sinks: bool

    @property
    def any(self) -> bool:
        return self.window is not None or self.softcap is not None or self.sinks

    def names(self) -> str:
        """How one-line refusals name what a path cannot apply."""
        parts = []
        if self.window is not None:
            parts.append(f"a sliding window ({self.window} tokens)")
        if self.sinks:
            parts.append("attention sinks")
        if self.softcap is not None:
            parts.append(f"attention logit softcapping ({self.softcap})")
        return " and ".join(parts)


def score_features(config: Any) -> ScoreFeatures:
    # counted whenever set: some models apply it only on "sliding_attention" layers, others
    # (Mistral, Starcoder2) on every layer whatever `layer_types` says
    window = getattr(config, "sliding_window", None)
    softcap = getattr(config, "attn_logit_softcapping", None)
    return ScoreFeatures(
        window=int(window) if window else None,  # 0 means off (Qwen2-MoE)
        softcap=float(softcap) if softcap is not None else None,
        sinks=getattr(config, "model_type", None) in _SINK_MODEL_TYPES,
    )


_SINK_MODEL_TYPES = frozenset({"gpt_oss"})


def apply_softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """In place, as transformers forms it: scores / C, tanh, * C (three roundings)."""
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


class WindowPlans:
    """A step's attention plans by the window a layer asks for: the full-attention plan, and
    one per window that binds (some query of the step sees more keys than the window), built
    at the first layer that asks. A window that binds no query gives every query the same
    keys as full attention, so the full plan serves it (the same bits)."""

    __slots__ = ("_build", "_plans", "full", "longest_context")

    def __init__(self, full: Any, build: Callable[[int], Any]) -> None:
        self.full = full
        self.longest_context = full.longest_context
        self._build = build
        self._plans: dict[int, Any] = {}

    def plan(self, window: int | None) -> Any:
        if window is None or window >= self.longest_context:
            return self.full
        plan = self._plans.get(window)
        if plan is None:
            plan = self._plans[window] = self._build(window)
        return plan
