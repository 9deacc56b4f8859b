"""Mixture-of-experts layers whose per-row result never depends on the other rows of the step.

transformers routes each token to its top-k experts and multiplies each expert by the rows
routed to it, so an expert's GEMM has as many rows as the step sent there: the same token
would get other bits beside other tokens. Under invariant numerics the engine swaps, in every
MoE block transformers builds with its experts interface (`use_experts_implementation`:
stacked 3-D `gate_up_proj`/`up_proj` and `down_proj`):

- the router (a module beside the experts owning a 2-D weight: `gate` or `router`) for a
  `RowPaddedRouter`: its rows run in blocks of the probed `RowScheme`, zero-padded to whole
  vector loops, so its GEMM and its elementwise kernels are invariant; everything else a
  router does (softmax or sigmoid scores, top-k with its ties, DeepSeek V3's bias-corrected
  group choice, the normalization and routed scaling) is a function of the row alone and
  runs as written;
- the experts for `InvariantExperts`: each expert's rows are gathered in token order and run
  through `scheme_linear` (the same scheme as every linear layer: an expert's GEMM of m rows is
  padded or split exactly as a dense layer's would be), then each token's k weighted expert
  outputs are added in its top-k slot order, one slot after the other (never `index_add_`,
  whose order follows the experts the step happened to use).

Shared experts and shared-expert gates are plain `nn.Linear` layers: `set_row_tiling` covers
them. Both wrappers register the wrapped module's tensors under their own names, so a
model's parameter names are the same tiled or not; `set_expert_tiling(model, False)` puts the
originals back.
"""

from __future__ import annotations

import torch
from torch import nn

from astrai_batch.engine.numerics.blas_rows import RowScheme, Shape, plain_gemm


def scheme_linear(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scheme: RowScheme
) -> torch.Tensor:
    """`F.linear(rows, weight, bias)` for 2-D `rows`, each row's bits independent of how many
    rows there are: GEMMs of the sizes `scheme` allows, the last block zero-padded."""
    n = rows.shape[0]
    if scheme.min_rows <= n <= scheme.max_rows:
        return plain_gemm(rows, weight, bias)
    out = rows.new_empty(n, weight.shape[0])
    start = 0
    while n - start >= scheme.min_rows:
        stop = min(n, start + scheme.max_rows)
        out[start:stop] = plain_gemm(rows[start:stop], weight, bias)
        start = stop
    if start < n:
        staged = rows.new_zeros(scheme.pad_to[n - start], rows.shape[1])
        staged[: n - start] = rows[start:]
        out[start:] = plain_gemm(staged, weight, bias)[: n - start]
    return out


def is_experts(module: nn.Module) -> bool:
    """A transformers experts module this file can run (its interface's flags and tensors)."""
    if not hasattr(module, "has_gate") or getattr(module, "_is_expert_parallel", False):
        return False
    up = getattr(module, "gate_up_proj" if module.has_gate else "up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and up.dim() == 3
        and down.dim() == 3
    )


def has_experts(model: nn.Module) -> bool:
    return any(_experts_child(module) for module in model.modules())


def router_of(block: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, module) of the router beside a block's experts: a child that is not a linear
    layer and owns a 2-D weight (MoE routers call `F.linear` on it themselves)."""
    for name, child in block.named_children():
        if type(child) is nn.Linear or is_experts(child) or isinstance(child, InvariantExperts):
            continue
        if isinstance(child, RowPaddedRouter):
            return name, child
        weight = getattr(child, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.dim() == 2:
            return name, child
    return None


class _Owning(nn.Module):
    """A wrapper that registers the wrapped module's own tensors under their names."""

    def __init__(self, wrapped: nn.Module) -> None:
        super().__init__()
        self._wrapped = (wrapped,)  # a tuple: not a submodule, so names stay the same
        for name, param in wrapped.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in wrapped.named_buffers(recurse=False):
            persistent = name not in wrapped._non_persistent_buffers_set
            self.register_buffer(name, buffer, persistent=persistent)
        for name, child in wrapped.named_children():
            self.add_module(name, child)

    @property
    def wrapped(self) -> nn.Module:
        return self._wrapped[0]


# A router's rows run in blocks padded to a multiple of this many rows: its elementwise
# kernels (DeepSeek V3's sigmoid over [rows, experts]) compute the last elements of a
# contiguous tensor with a scalar loop whose bits differ from the vector loop's, so a row's
# scores would follow the step's row count unless every block's size is a whole number of
# vector loops (64 rows x any expert count: 64 floats or bfloat16 lanes and more).
ROUTER_ROW_MULTIPLE = 64


class RowPaddedRouter(_Owning):
    """A router run on blocks of rows the scheme allows, each padded with zero rows to a
    multiple of `ROUTER_ROW_MULTIPLE`; its outputs are per row."""

    def __init__(self, router: nn.Module, scheme: RowScheme) -> None:
        super().__init__(router)
        self.scheme = scheme

    def padded_rows(self, rows: int) -> int:
        scheme = self.scheme
        wanted = max(rows, scheme.min_rows)
        target = -(-wanted // ROUTER_ROW_MULTIPLE) * ROUTER_ROW_MULTIPLE
        return target if target <= scheme.max_rows else scheme.max_rows

    def forward(self, hidden_states: torch.Tensor):
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        n = rows.shape[0]
        if n == 0:
            return self.wrapped(rows)
        parts = []
        single = False
        for start in range(0, n, self.scheme.max_rows):
            block = rows[start : start + self.scheme.max_rows]
            m = block.shape[0]
            size = self.padded_rows(m)
            if size > m:
                block = torch.cat([block, block.new_zeros(size - m, block.shape[1])])
            out = self.wrapped(block)
            single = not isinstance(out, tuple)
            parts.append(tuple(t[:m] for t in ((out,) if single else out)))
        if len(parts) == 1:
            joined = parts[0]
        else:
            joined = tuple(torch.cat(column) for column in zip(*parts, strict=True))
        return joined[0] if single else joined

    def extra_repr(self) -> str:
        return f"{type(self.wrapped).__name__}, {self.scheme.describe()}"


class InvariantExperts(_Owning):
    """A transformers experts module computed expert by expert on the row scheme."""

    def __init__(self, experts: nn.Module, scheme: RowScheme | dict[Shape, RowScheme]) -> None:
        super().__init__(experts)
        self.schemes = scheme
        self.num_experts = int(experts.num_experts)
        self.has_gate = bool(experts.has_gate)
        self.has_bias = bool(experts.has_bias)
        self.is_transposed = bool(experts.is_transposed)
        self.has_post_expert_norm = bool(getattr(experts, "has_post_expert_norm", False))

    def _project(self, rows, name: str, expert: int) -> torch.Tensor:
        weight = getattr(self.wrapped, name)[expert].detach()
        if self.is_transposed:  # stored [in, out]
            weight = weight.t()
        bias = getattr(self.wrapped, f"{name}_bias")[expert].detach() if self.has_bias else None
        shape = (weight.shape[1], weight.shape[0], bias is not None)
        return scheme_linear(rows, weight, bias, scheme_of(self.schemes, shape))

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        experts = self.wrapped
        n, k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        # (token, slot) pairs by expert, each expert's in token order
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        weights = top_k_weights.reshape(-1)
        # weighted outputs in the promoted type, summed there, then cast: as transformers'
        # default (grouped_mm) path does (DeepSeek's routers weigh in float32)
        kind = torch.promote_types(hidden_states.dtype, weights.dtype)
        slots = hidden_states.new_zeros(n * k, hidden_states.shape[-1], dtype=kind)
        start = 0
        for expert, count in enumerate(counts[: self.num_experts]):
            if not count:
                continue
            pairs = order[start : start + count]
            start += count
            rows = hidden_states.index_select(0, pairs // k)
            if self.has_gate:
                h = experts._apply_gate(self._project(rows, "gate_up_proj", expert))
            else:
                h = experts.act_fn(self._project(rows, "up_proj", expert))
            out = self._project(h, "down_proj", expert)
            if self.has_post_expert_norm:
                out = experts.post_expert_norm(out)
            out = out * weights.index_select(0, pairs).unsqueeze(-1)
            slots.index_copy_(0, pairs, out.to(kind))
        slots = slots.view(n, k, -1)
        total = slots[:, 0].clone()
        for slot in range(1, k):  # one slot after the other: a fixed order per row
            total += slots[:, slot]
        return total.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        schemes = self.schemes
        if isinstance(schemes, dict):
            return f"{type(self.wrapped).__name__}, a scheme per shape"
        return f"{type(self.wrapped).__name__}, {schemes.describe()}"


def scheme_of(scheme: RowScheme | dict[Shape, RowScheme], shape: Shape) -> RowScheme:
    """The scheme a GEMM of `shape` runs on: the one scheme, or its shape's."""
    return scheme[shape] if isinstance(scheme, dict) else scheme


def expert_gemm_shapes(model: nn.Module) -> list[tuple[int, int, bool]]:
    """(K, N, bias) of every expert and router GEMM of `model`, for the row-count probe."""
    shapes: set[tuple[int, int, bool]] = set()
    for block in model.modules():
        for child in block.children():
            experts = child.wrapped if isinstance(child, InvariantExperts) else child
            if not is_experts(experts):
                continue
            names = ("gate_up_proj" if experts.has_gate else "up_proj", "down_proj")
            for name in names:
                _, a, b = getattr(experts, name).shape
                k, n = (a, b) if experts.is_transposed else (b, a)
                shapes.add((k, n, bool(experts.has_bias)))
            found = router_of(block)
            if found is not None:
                out_features, in_features = found[1].weight.shape
                shapes.add((in_features, out_features, False))
    return sorted(shapes)


def set_expert_tiling(
    model: nn.Module, tiled: bool, scheme: RowScheme | dict[Shape, RowScheme] | None = None
) -> int:
    """Swaps every MoE block's experts and router for their invariant wrappers (or back);
    returns how many modules were swapped. `scheme`: one for every GEMM, or one per (K, N,
    bias) shape (bfloat16's per-shape tiles)."""
    if tiled and scheme is None:
        raise ValueError("tiling experts needs a row scheme")
    swapped = 0
    for block_name, block in list(model.named_modules()):
        children = dict(block.named_children())
        experts = [name for name, child in children.items() if _experts_child(child)]
        if not experts:
            continue
        prefix = f"{block_name}." if block_name else ""
        found = router_of(block)
        names = experts + ([found[0]] if found is not None else [])
        for name in names:
            child = children[name]
            if tiled and isinstance(child, (InvariantExperts, RowPaddedRouter)):
                continue
            if not tiled and not isinstance(child, (InvariantExperts, RowPaddedRouter)):
                continue
            if not tiled:
                replacement = child.wrapped
            elif name in experts:
                replacement = InvariantExperts(child, scheme)
            else:
                weight = found[1].weight  # [out, in]
                shape = (weight.shape[1], weight.shape[0], False)
                replacement = RowPaddedRouter(child, scheme_of(scheme, shape))
            model.set_submodule(prefix + name, replacement)
            swapped += 1
    return swapped


def _experts_child(child: nn.Module) -> bool:
    return isinstance(child, InvariantExperts) or is_experts(child)
