"""The checks that let a decoder layer's C steps (`layer_kernels`) stand in for transformers'
operators: each compares a kernel with transformers' own module or function on adversarial
data, bit for bit, before a model uses it (`fused_layers`), and the MLP's activation is
taken from torch's own at every bfloat16 value.
"""

from __future__ import annotations

import torch
from torch import nn

from astrai_batch.engine.runner.layer_kernels import LANES, LayerKernels


def every_bfloat16() -> torch.Tensor:
    """All 65,536 bfloat16 values, in the order of their bits."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def activation_table(act) -> torch.Tensor | None:
    """`act` at every bfloat16 value (widened to float32, exactly), or None where its result
    depends on where a value sits:
    torch runs an elementwise operator's vectorized loop on contiguous data and its scalar loop
    on a tensor's tail and on strided data, and the two must agree for a table to stand in."""
    values = every_bfloat16()
    with torch.inference_mode():
        vector = act(values)
        spaced = torch.zeros(2 * values.numel(), dtype=torch.bfloat16)
        spaced[::2] = values
        scalar = act(spaced[::2])
    if vector.dtype != torch.bfloat16 or vector.shape != values.shape:
        return None
    same = vector.view(torch.int16) == scalar.view(torch.int16)
    agree = bool((same | (vector.isnan() & scalar.isnan())).all())
    return vector.float().contiguous() if agree else None


def adversarial_hidden(rows: int, width: int, seed: int) -> torch.Tensor:
    """bfloat16 rows whose sums of squares are sensitive to order: magnitudes over many
    binades, so a different summation order changes the last bit of most rows' mean."""
    gen = torch.Generator().manual_seed(seed)
    mant = torch.rand(rows, width, generator=gen) * 2 - 1
    exps = torch.randint(-12, 8, (rows, width), generator=gen).float()
    return (mant * torch.pow(2.0, exps)).to(torch.bfloat16)


def norm_matches(kernels: LayerKernels, norm: torch.nn.Module, rows=(1, 3, 64, 257)) -> int:
    """The vector width at which the C norm equals `norm` (transformers' RMSNorm module)
    bit for bit, with and without the residual add, at each row count, and its float32 mean
    of squares equals the one `norm` takes; 0 where none does."""
    width = norm.weight.shape[0]
    eps = float(norm.variance_epsilon)
    with torch.inference_mode():
        cases = []
        for seed, n in enumerate(rows):
            x = adversarial_hidden(n, width, seed)
            r = adversarial_hidden(n, width, seed + 100)
            means = x.float().pow(2).mean(-1)  # transformers' own expression
            cases.append((x, r, means, norm(x), norm(r + x), r + x))
        for lanes in LANES:
            if all(_norm_case(kernels, norm.weight, eps, lanes, *case) for case in cases):
                return lanes
    return 0


def _norm_case(kernels, weight, eps, lanes, x, r, means, expect, expect_added, total) -> bool:
    if not torch.equal(kernels.mean_squares(x, lanes), means):
        return False
    out, _ = kernels.rms_norm(x, weight, eps, lanes)
    added, s = kernels.rms_norm(x, weight, eps, lanes, add=r)
    return torch.equal(out, expect) and torch.equal(added, expect_added) and torch.equal(s, total)


def rotary_matches(kernels: LayerKernels, rotate, heads: tuple[int, int], dim: int) -> bool:
    """Whether the C rotary equals `rotate` (transformers' apply_rotary_pos_emb) bit for bit
    on random queries, keys and angles at a few token counts."""
    q_heads, k_heads = heads
    gen = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        for tokens in (1, 5, 64):
            q = adversarial_hidden(tokens, q_heads * dim, tokens)
            k = adversarial_hidden(tokens, k_heads * dim, tokens + 1)
            angles = torch.rand(tokens, dim // 2, generator=gen) * 300
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
            ref_q, ref_k = rotate(
                q.view(1, tokens, q_heads, dim).transpose(1, 2),
                k.view(1, tokens, k_heads, dim).transpose(1, 2),
                cos[None],
                sin[None],
            )
            got_q, got_k = kernels.rotary(q, k, cos, sin, dim)
            if not torch.equal(got_q, ref_q[0].transpose(0, 1)):
                return False
            if not torch.equal(got_k, ref_k[0].transpose(0, 1)):
                return False
    return True


def transformers_own(cls: type) -> bool:
    """Whether `cls` is defined in one of transformers' own modeling files."""
    return cls.__module__.startswith("transformers.models.")


def checked(check, failed=False):
    """A check's verdict; a check that raises (a module that takes other arguments) fails."""
    try:
        return check()
    except Exception:
        return failed


def mlp_activation_table(mlp: nn.Module, fusable: frozenset, memo: dict) -> torch.Tensor | None:
    """The table of `mlp`'s activation where its class is one of `fusable` (whose forward is
    Llama's: `down_proj(act_fn(gate_proj(x)) * up_proj(x))`), else None (the MLP runs as it
    is)."""
    if type(mlp).__name__ not in fusable or not hasattr(mlp, "act_fn"):
        return None
    if not transformers_own(type(mlp)):
        return None
    tables = memo.setdefault(("activation tables",), {})
    known = tables.get(id(mlp.act_fn))  # per instance: equal reprs may compute differently
    if known is None or known[0] is not mlp.act_fn:
        known = tables[id(mlp.act_fn)] = (mlp.act_fn, activation_table(mlp.act_fn))
    return known[1]


def norm_lanes(norm: nn.Module, kernels: LayerKernels, memo: dict) -> int:
    """The norm kernel's vector width at which it equals `norm` (transformers' own RMSNorm
    class), or 0; checked once per norm class, width and epsilon (`memo`)."""
    if not hasattr(norm, "variance_epsilon") or norm.weight.dim() != 1:
        return 0
    if not transformers_own(type(norm)):
        return 0
    key = ("fused norm", type(norm).__module__, type(norm).__name__, norm.weight.shape[0])
    key += (norm.variance_epsilon,)
    if key not in memo:
        memo[key] = checked(lambda: norm_matches(kernels, norm), failed=0)
    return memo[key]
