"""A fused decoder layer's forward called straight into its kernels: the steps
`FusedDecoderForward._fused` takes (the same C calls and packed GEMMs on the same inputs, so
the same bits), with what the wrappers between them check and build on every call checked
and built once per step (the attention kernel's job, the pool write) or per layer instead.

Why: at a decode step's 64 rows (SmolLM2, 2 threads, Zen 5) a layer's GEMMs and C steps
take ~1.1 ms and the Python around them took 0.15-0.33 ms more: the wrappers' dtype, shape
and stride checks, views, splits and slices, a 29-field ctypes job built per call,
transformers' attention dispatch and `paged_attention`'s. One decode step's layer replayed
(`docs/performance.md`): 1.32 ms through `_fused`, 1.15 ms here; decode steps 0.92x.

It runs only where every step is the common one: the step's attention is the CPU invariant
kernel (`InvariantKernelBatch`) through this engine's attention function, q/k/v and gate/up
run merged (`merged_gemms`, on their row scheme at any row count), the o and down
projections are `RowTiledLinear`s no hook watches, the KV pools take the step's rows and the
inputs are contiguous rows. Anything else returns None and the layer runs `_fused`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from astrai_batch.engine.attention.kernels.invariant_batch import InvariantKernelBatch
from astrai_batch.engine.attention.kernels.invariant_cpu import CpuKernel, KernelStep
from astrai_batch.engine.attention.paged_attention import paged_attention
from astrai_batch.engine.runner.invariant_linear import RowTiledLinear
from astrai_batch.engine.runner.layer_kernels import DirectCalls

# torch's registries of hooks on every module's call (`register_module_forward_hook`)
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


@dataclass(frozen=True)
class _Pools:
    """One layer's KV pools as the rotary pass and the kernel address them."""

    key: torch.Tensor
    value: torch.Tensor
    kv_heads: int
    value_dim: int


class StepJobs:
    """The attention kernel's call for the current step, shared by a model's fused layers:
    bound to the step's `InvariantKernelBatch` once (`CpuKernel.step`), then each layer
    passes its own queries and pools. Holds the step weakly, so a closed engine's pools are
    not kept alive by a model that outlives it."""

    def __init__(self) -> None:
        self._step: weakref.ref | None = None
        self._state: tuple[KernelStep, list[_Pools | None]] | None = None

    @property
    def holds_step(self) -> bool:
        return self._state is not None

    def for_step(self, batch: InvariantKernelBatch, tokens: int):
        """(kernel step, each layer's pools or None) for `batch`, or None where the step is
        not one the direct path runs (its kernel not the CPU one, other index arrays)."""
        if self._step is not None and self._step() is batch:
            return self._state
        self._state = _step_state(batch, tokens)
        self._step = weakref.ref(batch, self._forget)
        return self._state

    def _forget(self, gone: weakref.ref) -> None:
        """The step is gone: so go its pools' references (unless a later step's are here)."""
        if gone is self._step:
            self._step = self._state = None


def _step_state(batch: InvariantKernelBatch, tokens: int):
    attend = batch.attend
    kernel = getattr(attend, "__self__", None)
    if not isinstance(kernel, CpuKernel) or getattr(attend, "__func__", None) is not (
        CpuKernel.attend
    ):
        return None
    slots = batch.write_slots
    if slots.dtype != torch.int64 or slots.dim() != 1 or not slots.is_contiguous():
        return None
    arrays = (batch.token_table, batch.token_keys, batch.token_key_ends)
    if slots.numel() != tokens or any(a is not None and a.shape != (tokens,) for a in arrays):
        return None
    step = kernel.step(
        batch.tables, batch.token_table, batch.token_keys, batch.page_size, batch.token_key_ends
    )
    pools = [_layer_pools(k, v) for k, v in zip(batch.key_cache, batch.value_cache, strict=True)]
    return step, pools


def _layer_pools(key: torch.Tensor, value: torch.Tensor) -> _Pools | None:
    """A layer's pools where both are CPU bfloat16 [slots, kv heads, head size] with
    contiguous slots (what the rotary pass writes and the kernel reads), else None."""
    for pool in (key, value):
        if pool.dtype != torch.bfloat16 or pool.device.type != "cpu" or pool.dim() != 3:
            return None
        if not pool[0].is_contiguous():
            return None
    if key.shape[1] != value.shape[1]:
        return None
    return _Pools(key, value, key.shape[1], value.shape[-1])


def plain_module(module: nn.Module) -> bool:
    """Whether calling `module` runs its class's forward and nothing else (no hooks, no
    forward set on the instance): then its GEMM may be called directly."""
    if "forward" in module.__dict__:
        return False
    if module._forward_hooks or module._forward_pre_hooks:
        return False
    return not any(getattr(torch_module, name, None) for name in _GLOBAL_HOOKS)


def _plain_tiled(linear: nn.Module) -> bool:
    """Whether `linear` is a `RowTiledLinear` whose call runs its forward alone."""
    return type(linear) is RowTiledLinear and plain_module(linear)


class DirectLayer:
    """`FusedDecoderForward`'s steps for one layer, straight into the kernels."""

    def __init__(self, fused, jobs: StepJobs):
        self.fused = fused  # the FusedDecoderForward: its merges, kernels, table and window
        self.jobs = jobs

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch,
        interface,
    ) -> torch.Tensor | None:
        """The layer's output for `hidden` [1, T, width], or None where a step is not the
        common one (the caller then runs `_fused`)."""
        fused = self.fused
        if interface is not paged_attention or type(batch) is not InvariantKernelBatch:
            return None
        if fused.act_table is None or fused.qkv is None or fused.gate_up is None:
            return None
        if hidden.dim() != 3 or hidden.shape[0] != 1 or not hidden.is_contiguous():
            return None
        layer = fused.layer
        attn, mlp = layer.self_attn, layer.mlp
        tokens, width = hidden.shape[1], hidden.shape[2]
        dim = attn.head_dim
        if not (_angles(cos, tokens, dim) and _angles(sin, tokens, dim)):
            return None
        qkv, gate_up = fused.qkv, fused.gate_up
        if not qkv.applies((attn.q_proj, attn.k_proj, attn.v_proj)):
            return None
        if not gate_up.applies((mlp.gate_proj, mlp.up_proj)):
            return None
        o_proj, down_proj = attn.o_proj, mlp.down_proj
        if not (_plain_tiled(o_proj) and _plain_tiled(down_proj)):
            return None
        state = self.jobs.for_step(batch, tokens)
        if state is None:
            return None
        step, pools = state
        pool = pools[attn.layer_idx] if attn.layer_idx < len(pools) else None
        q_width, k_width, v_width = qkv.sizes
        if pool is None or q_width % dim or k_width != pool.kv_heads * dim:
            return None
        if v_width != pool.kv_heads * pool.value_dim or pool.key.shape[2] != dim:
            return None
        q_heads = q_width // dim
        if q_heads % pool.kv_heads:
            return None
        calls: DirectCalls = fused.kernels.direct
        threads = torch.get_num_threads()
        norm, post = layer.input_layernorm, layer.post_attention_layernorm
        rows = hidden.view(tokens, width)

        normed = calls.norm(rows, norm.weight, norm.variance_epsilon, fused.lanes, threads)
        projected = qkv.rows(normed)  # [T, q | k | v]
        angles = (cos.view(tokens, dim), sin.view(tokens, dim))
        queries = calls.rotary_into_pools(
            projected, (q_width, k_width), *angles, dim, (pool.key, pool.value),
            batch.write_slots, threads,
        )  # fmt: skip
        attended = torch.empty(tokens, q_heads, pool.value_dim, dtype=torch.bfloat16)
        window = fused.window.get("sliding_window")
        step.attend(queries, pool.key, pool.value, attended, attn.scaling, window, threads)
        attention = RowTiledLinear.forward(o_proj, attended.view(tokens, -1))
        normed, total = calls.norm(
            attention, post.weight, post.variance_epsilon, fused.lanes, threads, add=rows
        )
        gated = gate_up.rows(normed)  # [T, gate | up]
        half = gate_up.sizes[0]
        product = calls.act_mul(gated[:, :half], gated[:, half:], fused.act_table, threads)
        return (total + RowTiledLinear.forward(down_proj, product)).view(1, tokens, width)


def _angles(angles: torch.Tensor, tokens: int, dim: int) -> bool:
    """cos or sin as transformers' rotary embedding gives them: [1, T, dim] contiguous CPU
    bfloat16 (the rotary pass reads them as rows)."""
    return (
        angles.dtype == torch.bfloat16
        and angles.device.type == "cpu"
        and angles.shape == (1, tokens, dim)
        and angles.is_contiguous()
    )
