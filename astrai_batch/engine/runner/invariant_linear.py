"""Linear layers whose per-row result never depends on the other rows of the step.

A CPU GEMM picks its micro-kernels (and with them the order in which a row's products are
summed) partly from M, the number of rows: the step's token count. The same token could then
get last-bit-different activations in a step of 7 tokens and in a step of 300, and a sampled
token near a boundary of the distribution would flip. Every projection therefore runs M rows
the way a `RowScheme` says (`blas_rows`): on the CPU, measured at engine start, small steps
padded with zero rows to an M the BLAS treats like any large one and every other step as one
GEMM (in bfloat16 / float16: fixed tiles, probed per shape); elsewhere (no probe there yet)
GEMMs of exactly `DEFAULT_TILE_ROWS` rows.
"""

from __future__ import annotations

import torch
from torch import nn

from astrai_batch.engine.numerics.blas_rows import (
    DEFAULT_MAX_ROWS,
    Gemm,
    RowScheme,
    Shape,
    linear_shapes,
    plain_gemm,
    probe_row_scheme,
    probe_row_schemes,
)
from astrai_batch.engine.numerics.packed_gemm import (
    memory_allows,
    pack,
    packed_gemm,
    packing_matches,
    packing_supported,
)
from astrai_batch.engine.numerics.transposed_gemm import TransposedRoute
from astrai_batch.engine.runner.invariant_experts import expert_gemm_shapes

DEFAULT_TILE_ROWS = 128  # the scheme off the CPU, where no probe runs


# Outputs narrower than this many columns are computed as this many (zero weight rows) and
# handed on as a strided view: a contiguous [n, 1] output (Qwen2-MoE's shared-expert gate)
# would put a row's value at a place in the flattened tensor that depends on n, and an
# elementwise kernel applied next (sigmoid) computes its last elements with a scalar loop whose
# bits differ from the vector loop's; a strided view is computed element by element, or row by
# row, wherever the row sits.
NARROW_COLUMNS = 64


class RowTiledLinear(nn.Module):
    """`nn.Linear` computed by a `RowScheme`; shares the wrapped layer's parameters."""

    def __init__(self, linear: nn.Linear, scheme: RowScheme | int) -> None:
        super().__init__()
        if isinstance(scheme, int):
            if scheme < 2:
                # one-row GEMMs go to the BLAS's matrix-vector kernel, a different reduction
                raise ValueError(f"tile_rows must be >= 2, got {scheme}")
            scheme = RowScheme.tiles(scheme)
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.scheme = scheme
        # narrow outputs: a zero-padded copy of the weight (not a parameter: a derived tensor)
        self._wide: tuple[torch.Tensor, torch.Tensor | None] | None = None
        if self.out_features < NARROW_COLUMNS:
            weight = linear.weight.detach()
            wide = weight.new_zeros(NARROW_COLUMNS, self.in_features)
            wide[: self.out_features] = weight
            bias = None
            if linear.bias is not None:
                bias = weight.new_zeros(NARROW_COLUMNS)
                bias[: self.out_features] = linear.bias.detach()
            self._wide = (wide, bias)
        # the weight in oneDNN's layout (`packed_gemm`: the same bits as F.linear), or None
        self._packed: torch.Tensor | None = None
        # float32 decode steps asked transposed where that keeps the bits (`transposed_gemm`)
        self._transposed: TransposedRoute | None = None

    @property
    def tile_rows(self) -> int:
        return self.scheme.max_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        columns = NARROW_COLUMNS if self._wide is not None else self.out_features
        out = by_scheme(rows, self.scheme, self._gemm, columns)
        return out[:, : self.out_features].view(*lead, self.out_features)

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        if self._wide is not None:
            return plain_gemm(rows, *self._wide)
        bias = None if self.bias is None else self.bias.detach()
        if self._packed is not None:
            return packed_gemm(rows, self._packed, bias)
        if self._transposed is not None:
            return self._transposed.run(rows, self.weight.detach(), bias)
        return plain_gemm(rows, self.weight.detach(), bias)

    def extra_repr(self) -> str:
        packed = ", packed" if self._packed is not None else ""
        if self._transposed is not None:
            packed = f", transposed from {self._transposed.start} rows"
        return f"in={self.in_features}, out={self.out_features}, {self.scheme.describe()}{packed}"


def by_scheme(rows: torch.Tensor, scheme: RowScheme, gemm, columns: int) -> torch.Tensor:
    """`gemm` ([m, K] -> [m, columns]) over contiguous `rows` [n, K] as `scheme` says: one
    GEMM where n is in its range (the common case: no copy), else GEMMs of its largest row
    count and a remainder below its smallest zero-padded to an invariant size."""
    n = rows.shape[0]
    if scheme.min_rows <= n <= scheme.max_rows:
        return gemm(rows)
    out = rows.new_empty(n, columns)
    step = scheme.max_rows
    start = 0
    while n - start >= scheme.min_rows:
        stop = min(n, start + step)
        out[start:stop] = gemm(rows[start:stop])
        start = stop
    if start < n:  # the last rows go through a zero-padded GEMM of an invariant size
        staged = rows.new_zeros(scheme.pad_to[n - start], rows.shape[1])
        staged[: n - start] = rows[start:]
        out[start:] = gemm(staged)[: n - start]
    return out


def row_scheme_for(
    model: nn.Module, max_rows: int = DEFAULT_MAX_ROWS, gemm: Gemm = plain_gemm
) -> RowScheme:
    """The probed scheme for `model`'s linear shapes on its device (CPU), else fixed tiles.

    Raises NumericsUnavailableError when the BLAS gives no invariant row count."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu":
        return RowScheme.tiles(DEFAULT_TILE_ROWS)
    return probe_row_scheme(gemm_shapes(model), max_rows, gemm, param.dtype)


def gemm_shapes(model: nn.Module) -> list[tuple[int, int, bool]]:
    """Every (K, N, bias) GEMM shape the invariant layers run: linear layers, experts, routers."""
    return sorted({*linear_shapes(model, NARROW_COLUMNS), *expert_gemm_shapes(model)})


def row_schemes_for(model: nn.Module, max_rows: int = DEFAULT_MAX_ROWS) -> dict[Shape, RowScheme]:
    """Each GEMM shape's probed scheme on the CPU (`gemm_shapes`: linear layers, experts,
    routers; `probe_row_schemes`: per shape in a reduced precision), else fixed tiles. Raises
    NumericsUnavailableError where none holds."""
    param = next(model.parameters(), None)
    shapes = gemm_shapes(model)
    if param is None or param.device.type != "cpu":
        return {shape: RowScheme.tiles(DEFAULT_TILE_ROWS) for shape in shapes}
    return probe_row_schemes(shapes, max_rows, plain_gemm, param.dtype)


Schemes = int | RowScheme | dict[Shape, RowScheme]


def set_row_tiling(model: nn.Module, tiled: bool, tile_rows: Schemes | None = None) -> int:
    """Swaps every plain `nn.Linear` of `model` for a `RowTiledLinear` (or back); returns how
    many layers were swapped. A model serves one engine at a time, in either mode.
    `tile_rows`: a fixed tile size, one scheme, or a scheme per (in, out, bias) shape; None
    probes the BLAS (`row_schemes_for`).

    Subclasses of nn.Linear (quantized or otherwise special layers) are left alone: their
    forward is not the plain GEMM this module reproduces.
    """
    if tiled and tile_rows is None:
        if not any(type(m) is nn.Linear for m in model.modules()):
            return 0
        tile_rows = row_schemes_for(model)
    swapped = 0
    for name, module in list(model.named_modules()):
        if not name:
            continue
        if tiled and type(module) is nn.Linear:
            scheme = tile_rows
            if isinstance(tile_rows, dict):
                # narrow outputs run NARROW_COLUMNS wide (`RowTiledLinear`), probed so
                width = max(module.out_features, NARROW_COLUMNS)
                shape = (module.in_features, width, module.bias is not None)
                scheme = tile_rows[shape]
            model.set_submodule(name, RowTiledLinear(module, scheme))
        elif not tiled and isinstance(module, RowTiledLinear):
            model.set_submodule(name, _plain_linear(module))
        else:
            continue
        swapped += 1
    return swapped


def _plain_linear(tiled: RowTiledLinear) -> nn.Linear:
    linear = nn.Linear(
        tiled.in_features, tiled.out_features, bias=tiled.bias is not None, device="meta"
    )
    linear.weight = tiled.weight
    linear.bias = tiled.bias
    return linear


def pack_weights(model: nn.Module, memo: dict) -> int:
    """Gives every `RowTiledLinear` of `model` its weight packed for oneDNN where that keeps
    F.linear's bits (`packed_gemm`: bfloat16 on the CPU, the shape verified) and the copies
    fit in memory; returns how many layers run packed. `memo` (the loaded model's probe
    results) keeps the verdicts and the packed copies across engine starts."""
    layers = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, RowTiledLinear) and module._wide is None
    ]
    copies = _packed_copies(layers, memo)
    for name, module in layers:
        module._packed = copies.get(name)
    return len(copies)


def pack_plain_linears(model: nn.Module, memo: dict) -> int:
    """Fast numerics: each plain `nn.Linear` whose weight packs (as in `pack_weights`) becomes
    a one-GEMM layer on the packed copy (`whole_step_layers`). Returns how many."""
    return whole_step_layers(model, lambda layers: _packed_copies(layers, memo), "_packed")


def whole_step_layers(model: nn.Module, chosen, attribute: str) -> int:
    """Each plain `nn.Linear` of `model` (at least `NARROW_COLUMNS` wide) to which
    `chosen(named layers)` gives a value becomes a one-GEMM `RowTiledLinear`
    (`RowScheme.whole`, a plain layer's arithmetic) with that value as `attribute` (its packed
    weight, its transposed route); the others stay as they are. Returns how many were swapped."""
    layers = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module.out_features >= NARROW_COLUMNS
    ]
    values = chosen(layers)
    for name, module in layers:
        if name in values:
            tiled = RowTiledLinear(module, RowScheme.whole())
            setattr(tiled, attribute, values[name])
            model.set_submodule(name, tiled)
    return len(values)


def plain_weights(layers: list[tuple[str, nn.Module]], supported) -> list[tuple]:
    """(name, layer, verdict key) of the named layers whose weight is plain (not quantized or
    otherwise wrapped) and of a dtype and device `supported(dtype, device)` accepts; the key is
    (K, N, bias, threads), as the BLAS picks its kernels by thread count too."""
    kept = []
    for name, module in layers:
        weight = module.weight
        if type(weight.data) is not torch.Tensor:  # a tensor subclass: quantized weights
            continue
        if supported(weight.dtype, weight.device):
            shape = (module.in_features, module.out_features, module.bias is not None)
            kept.append((name, module, (*shape, torch.get_num_threads())))
    return kept


def _packed_copies(layers: list[tuple[str, nn.Module]], memo: dict) -> dict[str, torch.Tensor]:
    """The packed weight of each named layer that may run packed: a plain (not quantized or
    otherwise wrapped) weight of a dtype and device this torch packs, a shape whose packed GEMM
    gives F.linear's bits, all of them fitting in memory (else none)."""
    verdicts = memo.setdefault(("packed gemm",), {})
    packs = memo.setdefault(("packed weights",), {})
    wanted = []
    for name, module, key in plain_weights(layers, packing_supported):
        if key not in verdicts:
            verdicts[key] = packing_matches(*key[:3])
        if verdicts[key]:
            wanted.append((name, module))
    fresh = [(n, m) for n, m in wanted if n not in packs or packs[n][0] is not m.weight]
    if fresh and not memory_allows(sum(m.weight.nbytes for _, m in fresh)):
        return {}
    for name, module in fresh:
        packs[name] = (module.weight, pack(module.weight))
    return {name: packs[name][1] for name, _ in wanted}
