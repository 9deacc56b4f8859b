"""Llama-style decoder layers on the CPU in bfloat16 with their norms, the residual add before
the second norm, the rotary embedding and the MLP's activation each one C call
(`layer_kernels`), the same bits.

A decode step of 64 rows spends as long in the small operators between a layer's GEMMs as in
its attention: transformers' RMSNorm is eight torch operators, the rotary embedding twelve,
each ~10 us of dispatch for microseconds of work, 30 layers a step (SmolLM2). Here a layer's
forward is replaced on the instance (parameters, names and submodules untouched) by
`FusedDecoderForward`, which runs transformers' own `LlamaDecoderLayer.forward` and
`LlamaAttention.forward` line for line, calling the same projections, MLP and attention
function, with its q, k and v (and gate and up) as one GEMM each where that keeps their bits
(`merged_gemms`) and four steps in C:

- `input_layernorm(x)`; `post_attention_layernorm(x + attention)` with the add in the pass;
- `apply_rotary_pos_emb(q, k, cos, sin)` straight from the projections' rows;
- the MLP's `act_fn(gate) * up`, the activation looked up in a table of its value at every
  bfloat16 number, made by torch's own activation (where torch's vectorized and scalar loops
  agree on all of them: `activation_table`).

Only layers whose code is Llama's (the classes in `FAMILIES`: Llama, Mistral and Qwen2, whose
attention only adds the sliding window it passes; exact type names, as a subclass may change
anything) are fused, and only where the C norm equals each norm module and the C
rotary equals the module file's own `apply_rotary_pos_emb`, bit for bit on adversarial data
(`layer_checks`), so tokens and logits stay what transformers computes. Where a step is the
common one (the C attention kernel's, q/k/v and gate/up merged) the same steps run
straight into their kernels (`direct_layer`); `_fused` runs every other.
`ASTRAI_BATCH_FUSED_LAYERS=0` keeps transformers' forwards.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from astrai_batch.engine.attention.kernels.invariant_batch import InvariantKernelBatch
from astrai_batch.engine.attention.kernels.invariant_cpu import KernelUnavailable
from astrai_batch.engine.attention.paged_attention import BATCH_KWARG, KV_WRITTEN_KWARG
from astrai_batch.engine.model.converted import cache_root
from astrai_batch.engine.runner.direct_layer import DirectLayer, StepJobs
from astrai_batch.engine.runner.layer_checks import (
    checked,
    mlp_activation_table,
    norm_lanes,
    rotary_matches,
    transformers_own,
)
from astrai_batch.engine.runner.layer_kernels import (
    LayerKernels,
    PoolWrite,
    load_layer_kernels,
)
from astrai_batch.engine.runner.merged_gemms import merged_gemm

_LOG = logging.getLogger(__name__)
SWITCH_ENV_VAR = "ASTRAI_BATCH_FUSED_LAYERS"


@dataclass(frozen=True)
class Family:
    """A decoder layer class whose forward is LlamaDecoderLayer's, line for line."""

    attention: str  # its attention class, whose forward is LlamaAttention's but for `window`
    # the `sliding_window` that attention's forward passes to the attention function, or None
    # where it passes none (test_fused_layers compares the sources with Llama's)
    window: Callable[[nn.Module], int | None] | None = None


FAMILIES = MappingProxyType(
    {
        "LlamaDecoderLayer": Family("LlamaAttention"),
        "MistralDecoderLayer": Family(
            "MistralAttention", lambda attn: getattr(attn.config, "sliding_window", None)
        ),
        "Qwen2DecoderLayer": Family("Qwen2Attention", lambda attn: attn.sliding_window),
    }
)
# MLPs whose forward is LlamaMLP's: down_proj(act_fn(gate_proj(x)) * up_proj(x))
FUSABLE_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP"})


class FusedDecoderForward:
    """A fusable layer's forward; the instance attribute that replaces it."""

    def __init__(
        self,
        layer: nn.Module,
        family: Family,
        kernels: LayerKernels,
        lanes: int,
        act_table: torch.Tensor | None,
        memo: dict,
        jobs: StepJobs | None = None,
    ):
        self.layer = layer
        attn = layer.self_attn
        # q, k, v (and gate, up) as one GEMM where that keeps their bits (`merged_gemms`)
        self.qkv = merged_gemm((attn.q_proj, attn.k_proj, attn.v_proj), memo)
        mlp = layer.mlp
        self.gate_up = None
        if act_table is not None:
            self.gate_up = merged_gemm((mlp.gate_proj, mlp.up_proj), memo)
        window = {} if family.window is None else {"sliding_window": family.window(attn)}
        self.window = window  # the attention function's extra argument, as the family passes it
        self.kernels = kernels
        self.lanes = lanes
        self.act_table = act_table  # the MLP's activation at every bfloat16 value, or None
        # the attention function per implementation name: looked up per call, as transformers
        # does (a peer may switch the model to sdpa), without its registry's cost each time
        self._interfaces: dict[str, Callable] = {}
        self._eager = getattr(sys.modules[type(attn).__module__], "eager_attention_forward", None)
        # the common step straight into the kernels (`direct_layer`); the jobs are the model's
        self.direct = DirectLayer(self, StepJobs() if jobs is None else jobs)

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        layer = self.layer
        if not self._fused_call(args, kwargs):  # transformers' forward, as it was called
            return type(layer).forward(layer, *args, **kwargs)
        hidden = args[0] if args else kwargs["hidden_states"]
        batch = kwargs.get(BATCH_KWARG)
        if batch is not None:
            cos, sin = kwargs["position_embeddings"]
            out = self.direct.forward(hidden, cos, sin, batch, self._interface())
            if out is not None:
                return out
        return self._fused(*args, **kwargs)

    def _interface(self) -> Callable:
        """The attention function transformers' forward would call now."""
        name = self.layer.self_attn.config._attn_implementation
        interface = self._interfaces.get(name)
        if interface is None:
            interface = self._interfaces[name] = _attention_interface(name, self._eager)
        return interface

    def _fused_call(self, args: tuple, kwargs: dict) -> bool:
        """Whether a call runs fused: hidden states (alone positional) CPU bfloat16, no
        transformers cache (the engine keeps its own), no gradients wanted (the C steps have
        none), rotary embeddings given; anything else (a cache, training, a model moved to
        another device or dtype) runs transformers' forward."""
        hidden = args[0] if len(args) == 1 else kwargs.get("hidden_states")
        if len(args) > 1 or not isinstance(hidden, torch.Tensor):
            return False
        if hidden.device.type != "cpu" or hidden.dtype != torch.bfloat16:
            return False
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            return False
        if kwargs.get("position_embeddings") is None:
            return False
        norm = self.layer.input_layernorm.weight
        return not (torch.is_grad_enabled() and norm.requires_grad)

    def _fused(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        layer = self.layer
        attn, norm = layer.self_attn, layer.input_layernorm
        normed, _ = self.kernels.rms_norm(
            hidden_states, norm.weight, norm.variance_epsilon, self.lanes
        )
        input_shape = hidden_states.shape[:-1]
        dim = attn.head_dim
        tokens = input_shape.numel()
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        if self.qkv is not None and self.qkv.applies(projections):
            q, k, v = self.qkv.run(normed)
        else:
            q, k, v = (projection(normed) for projection in projections)
        # [1, T, D] angles broadcast over a batch of B rows, as transformers' operators do
        cos, sin = (angles.expand(*input_shape, dim) for angles in position_embeddings)
        k = k.reshape(tokens, -1)
        pools = self._pools(kwargs.get(BATCH_KWARG), attn.layer_idx, k, v, dim)
        q, k = self.kernels.rotary(q.reshape(tokens, -1), k, cos, sin, dim, pools)
        shape = (*input_shape, -1, dim)
        written = pools is not None
        attn_output, _ = self._interface()(
            attn,
            q.view(shape).transpose(1, 2),
            k.view(shape).transpose(1, 2),
            v.view(shape).transpose(1, 2),
            attention_mask,
            dropout=0.0 if not attn.training else attn.attention_dropout,
            scaling=attn.scaling,
            position_ids=position_ids,
            use_cache=use_cache,
            **self.window,
            **({KV_WRITTEN_KWARG: True} if written else {}),
            **kwargs,
        )
        attn_output = attn.o_proj(attn_output.reshape(*input_shape, -1).contiguous())
        post = layer.post_attention_layernorm
        normed, residual = self.kernels.rms_norm(
            attn_output, post.weight, post.variance_epsilon, self.lanes, add=hidden_states
        )
        mlp = layer.mlp
        if self.act_table is None:
            return residual + mlp(normed)
        if self.gate_up is not None and self.gate_up.applies((mlp.gate_proj, mlp.up_proj)):
            gate, up = self.gate_up.run(normed)
        else:
            gate, up = mlp.gate_proj(normed), mlp.up_proj(normed)
        return residual + mlp.down_proj(self.kernels.act_mul(gate, up, self.act_table))

    def _pools(
        self, batch, layer: int, keys: torch.Tensor, values: torch.Tensor, dim: int
    ) -> PoolWrite | None:
        """Where the rotary kernel writes the step's keys and values, as `paged_attention`
        would (a memcpy a row in the rotation's pass instead of two index_copy_ calls): the C
        attention kernel's pools; None where the step runs another attention path or pool
        layout (it writes them itself then). `keys` [T, Hk * dim], before rotation. The rest
        of what the write needs (dtypes, contiguous slots) the rotary kernel checks, once."""
        if not isinstance(batch, InvariantKernelBatch):
            return None
        k_pool, v_pool = batch.key_cache[layer], batch.value_cache[layer]
        values = values.reshape(keys.shape[0], -1, dim)  # [T, Hk, D], as the keys will be
        if k_pool.shape[1:] != (keys.shape[1] // dim, dim) or v_pool.shape[1:] != values.shape[1:]:
            return None
        return PoolWrite(k_pool, v_pool, batch.write_slots, values)


def _attention_interface(name: str, eager: Callable | None):
    """The attention function transformers' forward calls for implementation `name` (its
    modeling file's `eager_attention_forward` for "eager")."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get_interface(name, eager)


def set_fused_layers(model: nn.Module, fused: bool, memo: dict) -> int:
    """Fuses every fusable layer of `model` (or restores them all); returns how many
    changed. Checks run once per loaded model (`memo`, the probes' memo). Called after the
    numerics set the linears up (their row schemes and packed weights are merged as found)."""
    changed = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), FusedDecoderForward):
            del module.forward
            changed += 1
    if not fused:
        return changed
    kernels = _kernels(memo)
    if kernels is None:
        return changed
    jobs = StepJobs()  # one step's attention job, shared by the model's layers
    for module in model.modules():
        lanes = _fusable(module, kernels, memo)
        if lanes:
            table = mlp_activation_table(module.mlp, FUSABLE_MLPS, memo)
            family = FAMILIES[type(module).__name__]
            module.forward = FusedDecoderForward(module, family, kernels, lanes, table, memo, jobs)
            changed += 1
    return changed


def fusion_supported(model: nn.Module) -> bool:
    """CPU bfloat16 weights, not switched off."""
    if os.environ.get(SWITCH_ENV_VAR, "1").strip() == "0":
        return False
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cpu" and param.dtype == torch.bfloat16


def _kernels(memo: dict) -> LayerKernels | None:
    key = ("layer kernels",)
    if key not in memo:
        try:
            memo[key] = load_layer_kernels(cache_root())
        except (KernelUnavailable, OSError) as exc:
            _LOG.warning("the CPU layer kernels do not build here (%s); using torch's", exc)
            memo[key] = None
    return memo[key]


def _fusable(layer: nn.Module, kernels: LayerKernels, memo: dict) -> int:
    """The norm kernel's vector width for `layer`, or 0 where it is not fused."""
    family = FAMILIES.get(type(layer).__name__)
    attn = getattr(layer, "self_attn", None)
    if family is None or type(attn).__name__ != family.attention:
        return 0
    if not (transformers_own(type(layer)) and transformers_own(type(attn))):
        return 0  # a remote modeling file's class of the same name may do anything
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if any(n.weight.dtype != torch.bfloat16 or n.weight.device.type != "cpu" for n in norms):
        return 0
    lanes = {norm_lanes(n, kernels, memo) for n in norms}
    if len(lanes) != 1 or 0 in lanes:
        return 0
    rotate = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    dim = attn.head_dim
    heads = (attn.config.num_attention_heads, attn.config.num_key_value_heads)
    key = ("fused rotary", type(attn).__module__, heads, dim)
    if key not in memo:
        runs = rotate is not None and dim % 2 == 0
        memo[key] = runs and checked(lambda: rotary_matches(kernels, rotate, heads, dim))
    return lanes.pop() if memo[key] else 0
