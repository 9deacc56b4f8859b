"""Which linear layers a rank splits, and the refusals made before any process starts.

transformers declares a model's tensor-parallel plan in `config.base_model_tp_plan`: module
name patterns (`layers.*.self_attn.q_proj`) mapped to a style. We run the two styles that a
row's result can survive exactly: "colwise" (a rank holds a slice of the output features:
whole heads of q/k/v, a slice of gate/up) and "rowwise" (a slice of the input features, the
partial products summed over ranks: o/down). Layers the plan replicates (Qwen3's per-head
q/k norms: "replicated_with_grad_allreduce") and everything it does not name (embeddings,
norms) are whole on every rank. The LM head is split over the vocabulary where the model
class's own plan says "colwise_gather_output" (every causal LM we run; `vocab_head`).
Key/value heads fewer than the ranks are replicated: rank r holds KV head
r // (N / kv_heads), the one its query heads read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from astrai_batch.errors import ConfigError

COLWISE = "colwise"
ROWWISE = "rowwise"
VOCAB = "colwise_gather_output"  # the LM head's style in the model classes' `_tp_plan`
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
REPLICATED = frozenset({"replicate", "replicated_with_grad_allreduce"})  # whole on each rank


@dataclass(frozen=True)
class ShardPlan:
    """A model's plan at one world size: compiled patterns and the rank's head counts."""

    world_size: int
    patterns: tuple[tuple[re.Pattern[str], str], ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    def style(self, module_name: str) -> str | None:
        """The plan's style for a module of the base model (prefix stripped), or None."""
        for pattern, style in self.patterns:
            if pattern.fullmatch(module_name):
                return None if style in REPLICATED else style
        return None

    def kv_head_of(self, rank: int) -> int | None:
        """The one KV head rank `rank` holds when KV heads are replicated; None when split."""
        if self.num_kv_heads >= self.world_size:
            return None
        return rank // (self.world_size // self.num_kv_heads)


def shard_plan(config: Any, world_size: int, *, model_name: str) -> ShardPlan:
    """The plan for `world_size` ranks; ConfigError (one line, naming the counts) if the model
    has no plan, uses a style we do not run, or has head counts the ranks cannot split."""
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ConfigError(
            f"model {model_name!r} ({getattr(config, 'model_type', '?')}) has no tensor-parallel "
            "plan in transformers (config.base_model_tp_plan); run it with "
            "--tensor-parallel-size 1"
        )
    quantized = getattr(config, "quantization_config", None)
    if quantized:
        method = (
            quantized.get("quant_method", "?")
            if isinstance(quantized, dict)
            else getattr(quantized, "quant_method", "?")
        )
        raise ConfigError(
            f"model {model_name!r} is a quantized checkpoint ({method}); tensor parallelism "
            "reads unquantized weights only; run it with --tensor-parallel-size 1"
        )
    counted = [name for name in _EXPERT_COUNTS if getattr(config, name, None)]
    experts = f"{counted[0]}={getattr(config, counted[0])}" if counted else None
    if experts is not None:
        # transformers' plans split stacked expert weights as a whole 3-D tensor per rank,
        # which our sharded loading (2-D linear layers) does not do
        raise ConfigError(
            f"model {model_name!r} is a mixture-of-experts model ({experts}); tensor "
            "parallelism does not split expert layers yet; run it with --tensor-parallel-size 1"
        )
    if getattr(config, "kv_lora_rank", None):
        # every rank would need the whole latent per token beside its heads' kv_b_proj share
        raise ConfigError(
            f"model {model_name!r} uses multi-head latent attention (kv_lora_rank="
            f"{config.kv_lora_rank}); tensor parallelism does not split latent pages yet; run "
            "it with --tensor-parallel-size 1"
        )
    supported = {COLWISE, ROWWISE, *REPLICATED}
    unsupported = sorted({style for style in plan.values() if style not in supported})
    if unsupported:
        raise ConfigError(
            f"model {model_name!r}: its tensor-parallel plan uses {', '.join(unsupported)}; "
            "only colwise, rowwise and replicated layers are supported; run it with "
            "--tensor-parallel-size 1"
        )
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_ok = kv_heads % world_size == 0 or world_size % kv_heads == 0
    if heads % world_size or not kv_ok:
        raise ConfigError(
            f"--tensor-parallel-size {world_size} does not divide the heads of model "
            f"{model_name!r}: {heads} query heads, {kv_heads} key/value heads (the size must "
            "divide the query heads, and divide or be a multiple of the key/value heads)"
        )
    patterns = tuple(
        (re.compile(re.escape(name).replace(r"\*", r"\d+")), style) for name, style in plan.items()
    )
    return ShardPlan(world_size, patterns, heads, kv_heads, int(head_dim))
